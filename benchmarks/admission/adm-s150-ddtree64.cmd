python benchmarks/admission/admission_profile.py --shape smollm2-135m --spec ddtree:64 --prompt-len 150 --requests 30 --out adm-s150-ddtree64.json

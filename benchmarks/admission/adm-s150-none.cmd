python benchmarks/admission/admission_profile.py --shape smollm2-135m --spec none --prompt-len 150 --requests 30 --out adm-s150-none.json

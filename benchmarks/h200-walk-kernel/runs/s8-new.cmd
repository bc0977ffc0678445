PYTHONPATH=. python3 -m treeflash.cli bench --synthetic smollm2-135m --context 1024 --rounds 40 --stage-rounds 3 --no-plots --batch-sizes 8 --methods none,ddtree:64 --out s8-new.json

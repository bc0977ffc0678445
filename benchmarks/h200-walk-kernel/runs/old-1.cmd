PYTHONPATH=./.stage/old python3 -m treeflash.cli bench --synthetic smollm2-135m --context 1024 --rounds 40 --stage-rounds 3 --no-plots --batch-sizes 1 --methods none,dflash,ddtree:64 --out old-1.json

PYTHONPATH=. python3 -m treeflash.cli bench --synthetic qwen3-30b-a3b --context 1024 --rounds 20 --stage-rounds 2 --no-plots --batch-sizes 1,8 --methods none,ddtree:16,ddtree:64 --out new.json

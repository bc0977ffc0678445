PYTHONPATH=./.stage/old python3 -m treeflash.cli bench --synthetic qwen3-8b --context 1024 --rounds 30 --stage-rounds 2 --no-plots --batch-sizes 1 --methods none,ddtree:64 --out q8-old-2.json

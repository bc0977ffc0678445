python3 -m treeflash.cli bench --synthetic qwen3-30b-a3b --context 1024 --rounds 20 --stage-rounds 2 --no-plots --batch-sizes 1,4 --methods none --out new.json

python benchmarks/serve_load.py --url http://127.0.0.1:8100 --clients 32 --duration 15 --check-dtype float32 --model /root/smollm2.gguf --check-max-num-seqs 32 --out c32.json

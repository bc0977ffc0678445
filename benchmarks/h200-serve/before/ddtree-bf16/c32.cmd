python benchmarks/serve_load.py --url http://127.0.0.1:8100 --clients 32 --duration 25 --no-check --out c32.json

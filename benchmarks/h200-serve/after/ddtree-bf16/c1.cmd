python benchmarks/serve_load.py --url http://127.0.0.1:8100 --clients 1 --duration 15 --no-check --out c1.json

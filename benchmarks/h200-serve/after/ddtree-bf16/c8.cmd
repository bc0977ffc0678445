python benchmarks/serve_load.py --url http://127.0.0.1:8100 --clients 8 --duration 20 --no-check --out c8.json

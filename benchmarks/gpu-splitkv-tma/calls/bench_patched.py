"""`treeflash bench` with `launch_for`'s launch classes replaced by BEST.json's (sweep_tma.py's choice):
`python3 bench_patched.py BEST.json bench ARGS...`. An empty BEST.json runs the rule unchanged."""
import json
import sys

import treeflash.splitkv_attention as K
from treeflash.cli import main

for name, fields in json.load(open(sys.argv[1])).items():
    setattr(K, name, K.Launch(**fields))
    print("patched", name, getattr(K, name), flush=True)
sys.exit(main(sys.argv[2:]))

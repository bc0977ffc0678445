"""The seventh run's held-out acceptance, measured afterwards for the shipped weights (the run ended
before its final evaluation) and for the fifth drafter it started from, on this CPU in float32.

The same 32 held-out prompts as the run (its prompt files, split with seed 0), 128 new tokens, the
run's probe (`AcceptanceProbe`: the DFlash chain and DDTree at budget 64, every prompt in one batch),
temperatures 0 and 1. The run's own evaluations ran on an H200 in bfloat16, so their numbers differ
a little from these.
Usage: python results/smollm2_drafter_v7/held_out.py SHAREGPT_ALL.jsonl.gz CODE_PROMPTS.jsonl.gz
(the two files `treeflash/default_drafter/README.md` says how to write).
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from treeflash.checkpoint import load_drafter, resolve_model_dir
from treeflash.llm import LLM
from treeflash.train.data import prompt_token_ids
from treeflash.train.evaluate import AcceptanceProbe
from treeflash.train.prompts import load_prompts, split_prompts

FIFTH = "aba368e"  # the last commit that shipped the fifth drafter
FILES = ("config.json", "draft_vocab.json", "model.safetensors.index.json",
         "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")

torch.set_num_threads(2)
shipped = Path(__file__).resolve().parents[2] / "treeflash" / "default_drafter"
_, held_out = split_prompts(load_prompts(",".join(sys.argv[1:3])), 32, seed=0)
model = str(resolve_model_dir(None))
ids = [prompt_token_ids(LLM(model, device="cpu", spec="none"), p, 256) for p in held_out]
results = {}
with tempfile.TemporaryDirectory() as fifth:
    for name in FILES:
        blob = subprocess.run(["git", "show", f"{FIFTH}:treeflash/default_drafter/{name}"], check=True,
                              capture_output=True, cwd=shipped).stdout
        (Path(fifth) / name).write_bytes(blob)
    for label, directory in (("seventh (shipped)", shipped), ("fifth", fifth)):
        probe = AcceptanceProbe(model, directory, ids, device="cpu", dtype=torch.float32, budget=64,
                                max_new_tokens=128, max_num_seqs=len(ids))
        results[label] = probe.measure(load_drafter(str(directory), "cpu", torch.float32), (0.0, 1.0))
        print(label, results[label], flush=True)
print(json.dumps(results, indent=1))

"""The caches a chat request without max_tokens leaves on the CPU: the default pair (8 slots), one
conversation (temperature 0, or --temperature T --seed S) whose max_tokens is the rest of the context (what `treeflash serve` asks for
a chat request without max_tokens); then the rows per slot, the caches' bytes and the process's resident
memory (VmRSS, VmHWM), before the request and after it.

    python benchmarks/cpu-cache-growth/chat_memory.py [--out FILE.json]
"""
import argparse
import json
import sys
import time
from pathlib import Path

from treeflash import LLM, SamplingParams
from treeflash.provenance import git_commit, source_digest


def status(key: str) -> int:
    """A /proc/self/status field in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) // 1024
    raise KeyError(key)


def caches(llm: LLM) -> dict:
    sp = llm.engine.speculator
    size = sp.cache.nbytes + (sp.draft_cache.nbytes if sp.draft_cache is not None else 0)
    return {"rows_per_slot": sp.capacity, "cache_mib": round(size / 2**20, 1), "rss_mib": status("VmRSS"),
            "peak_rss_mib": status("VmHWM")}


parser = argparse.ArgumentParser()
parser.add_argument("--temperature", type=float, default=0.0)
parser.add_argument("--seed", type=int, default=None)
parser.add_argument("--out")
args = parser.parse_args()
llm = LLM()
messages = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
ids = llm.chat_token_ids(messages)
before = caches(llm)
start = time.perf_counter()
out = llm.generate(prompt_token_ids=[ids], sampling_params=SamplingParams(
    temperature=args.temperature, seed=args.seed, max_tokens=llm.max_model_len - len(ids)))[0]
result = {"command": "python benchmarks/cpu-cache-growth/chat_memory.py " + " ".join(sys.argv[1:]),
          "git_commit": git_commit(), "source_digest": source_digest(), "max_model_len": llm.max_model_len,
          "prompt_tokens": len(ids), "generated_tokens": len(out.token_ids), "finish_reason": out.finish_reason,
          "seconds": round(time.perf_counter() - start, 2), "before": before, "after": caches(llm),
          "token_ids": out.token_ids}
print(json.dumps({k: v for k, v in result.items() if k != "token_ids"}))
if args.out:
    Path(args.out).write_text(json.dumps(result, indent=1))

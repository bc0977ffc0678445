"""How long a process's first `json_object` request waits for its structure, with the compiled-structure
store empty and then holding it (treeflash/structure_store.py).

Each measurement is a fresh process (`--child`) that loads the model, then times `LLM.compile_structures`
for one json_object request: what a server's first such request after a start waits before its prefill.
The store is a temporary TREEFLASH_CACHE, emptied before the first process.

    python benchmarks/cpu-structure-store/first_request.py --out store.json
    python benchmarks/cpu-structure-store/first_request.py --model PATH.gguf --out store-qwen.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(model: str | None) -> None:
    from treeflash import LLM, SamplingParams

    llm = LLM(model, spec="none", device="cpu")
    [request] = llm.new_requests([llm.encode("Describe a cat.")],
                                 [SamplingParams(max_tokens=8, structured_outputs={"json_object": True})],
                                 compile_structures=False)
    start = time.perf_counter()
    llm.compile_structures([request])
    seconds = time.perf_counter() - start
    grammar = request.grammar
    print(json.dumps({"seconds": seconds, "states": grammar.num_states, "transitions": len(grammar.keys),
                      "vocab_size": grammar.vocab_size}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="target (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--runs", type=int, default=3, help="processes with the store holding it (default 3)")
    parser.add_argument("--out", help="the result JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.model)
    if args.out is None:
        parser.error("--out is required")
    from treeflash.gguf_convert import default_cache_dir
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TREEFLASH_CACHE": cache}
        for kept in ("converted", "gguf"):  # (converted checkpoints live in the cache too: not converted again)
            if (default_cache_dir() / kept).is_dir():
                (Path(cache) / kept).symlink_to(default_cache_dir() / kept)
        command = [sys.executable, __file__, "--child", *(["--model", args.model] if args.model else [])]
        runs = []
        for i in range(1 + args.runs):
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]) | {"store": "empty" if i == 0 else "holding it"})
            print(runs[-1], flush=True)
        files = sorted(p.stat().st_size for p in (Path(cache) / "structures").glob("*.npz"))
    result = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "model": args.model or "SmolLM2-135M-Instruct",
              "runs": runs, "stored_bytes": files, "date": time.strftime("%Y-%m-%d %H:%M")}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

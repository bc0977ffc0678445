"""The same work on the thread that built the model and on a second thread, CPU, two torch threads.

An OpenMP runtime keeps a pool of worker threads per thread that ran a parallel region. Once the
builder's pool and a second thread's pool together hold more threads than there are cores, GNU OpenMP
stops spinning between parallel regions, and every small parallel op pays a sleep and a wake-up. This
times (1) a small product (9 x 576 by 576 x 1536, a SmolLM2 MLP projection at a tree's rows) and
(2) `LLM.chat` with the default pair on MT-Bench first turns, on the main thread and on a second
thread, both after the model was built on the main thread (one process), and (3) both on a second
thread that also built the model, in a process whose main thread runs no torch op: the engine on the
builder's thread, which is what `treeflash serve` and `run-batch` now arrange. Each case is a process of
its own.

    python benchmarks/cpu-engine-thread/thread_vs_main.py --out thread_vs_main.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path


def on_thread(fn):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()))
    thread.start()
    thread.join()
    return out["value"]


def measure(args, case: str) -> dict:
    import torch

    from treeflash import LLM, SamplingParams
    from treeflash.bench.datasets import load_prompts

    conversations = [list(p.messages) for p in load_prompts("mtbench", args.num_prompts)]
    greedy = SamplingParams(temperature=0, max_tokens=args.max_tokens)

    def product_us() -> float:
        torch.set_num_threads(args.threads)
        x, w = torch.randn(9, 576), torch.randn(1536, 576)
        for _ in range(50):
            torch.nn.functional.linear(x, w)
        start = time.perf_counter()
        for _ in range(500):
            torch.nn.functional.linear(x, w)
        return round((time.perf_counter() - start) / 500 * 1e6, 1)

    def chat_seconds(llm) -> list[float]:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            llm.chat(conversations, greedy, use_tqdm=False)
            times.append(round(time.perf_counter() - start, 2))
        return times

    def build():
        torch.set_num_threads(args.threads)
        return LLM(max_num_seqs=len(conversations))

    if case == "built-on-thread":  # (this process's main thread runs no torch op at all)
        return on_thread(lambda: (lambda llm: {"product_us": product_us(), "chat_seconds": chat_seconds(llm)})(
            build()))
    llm = build()
    return {"main_thread": {"product_us": product_us(), "chat_seconds": chat_seconds(llm)},
            "second_thread": on_thread(lambda: {"product_us": product_us(), "chat_seconds": chat_seconds(llm)})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(measure(args, args.case)))
        return
    result = {"command": " ".join(["python", "benchmarks/cpu-engine-thread/thread_vs_main.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%d %H:%M"), "torch_threads": args.threads,
              "prompts": args.num_prompts, "max_tokens": args.max_tokens}
    for case, key in (("built-on-main", "model_built_on_main"), ("built-on-thread", "model_built_on_the_thread")):
        child = subprocess.run([sys.executable, __file__, "--case", case, *sys.argv[1:]], capture_output=True,
                               text=True, check=True)
        result[key] = json.loads(child.stdout.strip().splitlines()[-1])
    print(json.dumps(result, indent=1), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

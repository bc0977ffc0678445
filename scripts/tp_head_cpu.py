"""Measure the two ways a tensor-parallel rank can get full logits, on CPU with gloo (2 processes):

- replicated: every rank multiplies by the whole output head [V, H];
- vocab-parallel: every rank multiplies by its half [V/2, H], then an all-gather assembles [T, V].

Rows T: 1 (autoregressive step), 16 (a DFlash block), 65 (a DDTree:64 round). Prints JSON (median ms
of rank 0 over the repeats). Usage: OMP_NUM_THREADS=1 python scripts/tp_head_cpu.py [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SHAPES = {"smollm2 (V=49152, H=576)": (49152, 576), "qwen3 vocab, H=1024 (V=151936)": (151936, 1024)}
ROWS = (1, 16, 65)
REPEATS = 15


def _rank(rank: int, port: int, results) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, wait_for_workers=False)
    group = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=300))
    out = {}
    for name, (vocab, hidden) in SHAPES.items():
        head = torch.randn(vocab, hidden) * 0.02
        half = head[rank * vocab // 2:(rank + 1) * vocab // 2].contiguous()
        for rows in ROWS:
            x = torch.randn(rows, hidden)
            timings = {"replicated": [], "vocab_parallel": []}
            for _ in range(REPEATS):
                group.barrier().wait()
                start = time.perf_counter()
                torch.nn.functional.linear(x, head)
                timings["replicated"].append(time.perf_counter() - start)
                group.barrier().wait()
                start = time.perf_counter()
                part = torch.nn.functional.linear(x, half)
                gathered = [torch.empty_like(part) for _ in range(2)]
                group.allgather([gathered], [part]).wait()
                torch.cat(gathered, dim=-1)
                timings["vocab_parallel"].append(time.perf_counter() - start)
            out[f"{name}, T={rows}"] = {k: round(1e3 * statistics.median(v), 3) for k, v in timings.items()}
    if rank == 0:
        results.put(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args()
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    port = store.port
    del store  # free the port for rank 0's own store
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    out = results.get()
    for p in procs:
        p.join()
    report = {"what": "median ms on rank 0 to get full float32 logits [T, V]; CPU, gloo, 2 processes, 1 thread each",
              "torch": torch.__version__, "cpus": os.cpu_count(),
              "load_average_1min": round(os.getloadavg()[0], 2), "results": out}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

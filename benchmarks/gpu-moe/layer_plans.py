"""One mixture-of-experts layer at Qwen3-30B-A3B's shape (hidden 2,048, 128 experts of width 768, 8 per token,
random bfloat16 weights): each expert plan of `SparseMoE` (gemv, grouped, gathered, dense;
treeflash/models/layers.py) timed as a CUDA graph replay at N tokens, against the bytes of the experts those
tokens chose. `--gemv-launches` times the gemv plan's Triton kernels (treeflash/moe_kernel.py) at other block
sizes too, as columns gemv/BJ,BH,BI,BK,WARPS.

N = 1 is a one-token step, 17 and 65 a DDTree round's verify at budgets 16 and 64 (batch 1), 520 and 2,080
the same at batch 8 and 32. A plan's replay is timed over `--replays` replays (median of `--repeats`); its
output is compared with the gathered plan's (bfloat16 rounding apart, they compute the same sum).

    python benchmarks/gpu-moe/layer_plans.py --out layer_plans.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", default="1,2,4,8,17,33,65,130,520,2080")
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gemv-launches", default="",
                        help="';'-separated block_j,block_h,block_i,block_k,num_warps of moe_kernel.Launch to time")
    args = parser.parse_args()

    import torch

    from treeflash.bench.timing import copy_bandwidth
    from treeflash.config import ExpertsConfig
    from treeflash.models.layers import SparseMoE

    device, dtype = torch.device("cuda"), torch.bfloat16
    hidden, cfg = 2048, ExpertsConfig(count=128, per_token=8, intermediate_size=768, normalize=True,
                                      sparse_layers=(0,))
    with torch.device("meta"):
        layer = SparseMoE(hidden, cfg)
    layer = layer.to_empty(device=device).to(dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.02, generator=gen)
    layer.stack_experts()
    expert_bytes = 3 * hidden * cfg.intermediate_size * 2
    bandwidth = copy_bandwidth(device)
    from treeflash.moe_kernel import Launch, expert_mlp

    launches = {f"gemv/{spec}": Launch(*map(int, spec.split(","))) for spec in args.gemv_launches.split(";") if spec}
    plans = (["gemv"] if layer.gemv else []) + list(launches) + (["grouped"] if layer.grouped else []) + [
        "gathered", "dense"]
    result = {"command": " ".join(["python", "benchmarks/gpu-moe/layer_plans.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%d %H:%M"), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "grouped_product_runs": layer.grouped,
              "copy_bandwidth_bytes_per_s": bandwidth, "expert_bytes": expert_bytes, "rows": []}
    print(f"{result['gpu']}, torch {torch.__version__}, grouped product: {layer.grouped}, copy bandwidth "
          f"{bandwidth / 1e9:.0f} GB/s")
    print(f"{'tokens':>6} {'experts':>7} {'floor us':>9} " + " ".join(f"{p + ' us':>{max(12, len(p) + 3)}}" for p in plans))
    for n in map(int, args.tokens.split(",")):
        x = torch.randn(1, n, hidden, device=device, dtype=dtype, generator=gen)
        with torch.no_grad():
            _, chosen = layer.route(x[0])
        used = int(torch.unique(chosen).numel())
        row = {"tokens": n, "experts_chosen": used, "floor_us": 1e6 * used * expert_bytes / bandwidth}
        outputs = {}
        for plan in plans:
            if plan in launches:  # the gemv plan at another launch
                layer._gemv = lambda x, w, c, launch=launches[plan]: expert_mlp(x, *layer.stacked, w, c, launch)
            layer.plan = lambda chosen, plan=plan: "gemv" if plan in launches else plan
            try:
                with torch.no_grad():
                    layer(x)  # warm-up, eagerly
                    stream = torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        layer(x)
                    torch.cuda.current_stream().wait_stream(stream)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        out = layer(x)
                times = []
                for _ in range(args.repeats):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(args.replays):
                        graph.replay()
                    torch.cuda.synchronize()
                    times.append((time.perf_counter() - start) / args.replays)
                row[f"{plan}_us"] = 1e6 * statistics.median(times)
                outputs[plan] = out.float().clone()
                del graph
            except Exception as e:  # noqa: BLE001 (a plan that cannot run or be captured: say so, go on)
                row[f"{plan}_error"] = f"{type(e).__name__}: {e}"[:300]
            finally:
                del layer.plan
                layer.__dict__.pop("_gemv", None)
        if "gathered" in outputs:
            row["max_abs_diff_vs_gathered"] = {p: float((o - outputs["gathered"]).abs().max())
                                               for p, o in outputs.items() if p != "gathered"}
        result["rows"].append(row)
        cells = " ".join(f"{row[p + '_us']:>{max(12, len(p) + 3)}.1f}" if p + "_us" in row
                         else f"{'error':>{max(12, len(p) + 3)}}" for p in plans)
        print(f"{n:>6} {used:>7} {row['floor_us']:>9.1f} {cells}")
        Path(args.out).write_text(json.dumps(result, indent=2))
    for row in result["rows"]:
        for key in [k for k in row if k.endswith("_error")]:
            print(row["tokens"], key, row[key])


if __name__ == "__main__":
    main()

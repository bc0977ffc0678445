"""One mixture-of-experts layer on the CPU: the gathered plan (each token's k experts' weights copied, then a
batch of matrix-vector products) against the looped one (each pair's products read the stacked weights in place,
a host loop over the pairs), at a few shapes and token counts, float32 and bfloat16, random weights.

Each plan is timed as the median of `--repeats` calls after one warm-up; the outputs are compared (the two
plans round the same products in other orders). Shapes: name=hidden,experts,per_token,width.

    python benchmarks/cpu-moe-looped/layer_plans_cpu.py --out layer_plans_cpu.json
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

SHAPES = "tiny=32,8,2,16;qwen1.5-moe-a2.7b=2048,60,4,1408;qwen3-30b-a3b=2048,128,8,768"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--tokens", default="1,4,16,64")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()

    import torch

    from treeflash.config import ExpertsConfig
    from treeflash.models.layers import SparseMoE

    if args.threads:
        torch.set_num_threads(args.threads)
    result = {"command": " ".join(["python", "benchmarks/cpu-moe-looped/layer_plans_cpu.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "rows": []}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'shape':>18} {'dtype':>8} {'tokens':>6} {'gathered ms':>12} {'looped ms':>10} {'ratio':>6} {'max diff':>9}")
    for spec in args.shapes.split(";"):
        name, dims = spec.split("=")
        hidden, count, per_token, width = map(int, dims.split(","))
        cfg = ExpertsConfig(count=count, per_token=per_token, intermediate_size=width, normalize=True,
                            sparse_layers=(0,))
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            with torch.device("meta"):
                layer = SparseMoE(hidden, cfg)
            layer = layer.to_empty(device="cpu").to(dtype)
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in layer.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            layer.stack_experts()
            for n in map(int, args.tokens.split(",")):
                x = torch.randn(n, hidden, generator=gen).to(dtype)
                row = {"shape": name, "dtype": str(dtype).removeprefix("torch."), "tokens": n}
                outputs = {}
                with torch.no_grad():
                    weights, chosen = layer.route(x)
                    for plan in ("gathered", "looped"):
                        run = getattr(layer, "_" + plan)
                        outputs[plan] = run(x, weights, chosen)
                        times = []
                        for _ in range(args.repeats):
                            start = time.perf_counter()
                            run(x, weights, chosen)
                            times.append(time.perf_counter() - start)
                        row[f"{plan}_ms"] = 1e3 * statistics.median(times)
                row["max_abs_diff"] = float((outputs["looped"].float() - outputs["gathered"].float()).abs().max())
                result["rows"].append(row)
                print(f"{name:>18} {row['dtype']:>8} {n:>6} {row['gathered_ms']:>12.2f} {row['looped_ms']:>10.2f} "
                      f"{row['gathered_ms'] / row['looped_ms']:>6.2f} {row['max_abs_diff']:>9.1e}")
                Path(args.out).write_text(json.dumps(result, indent=2))
            del layer


if __name__ == "__main__":
    main()

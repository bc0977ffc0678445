"""float32 splitkv at launch_for's float32 launches against the float32 dense reference (Qwen3-8B and SmolLM2
heads, context 1,024): the launches compile (shared memory) and attend exactly enough."""
import sys

import torch

sys.path.insert(0, "benchmarks")
import splitkv_ab  # noqa: E402

CUDA = torch.cuda.is_available()
if not CUDA:
    sys.path.insert(0, "tests")
    from triton_interpreter import mend_interpreter
    mend_interpreter()
from treeflash.splitkv_attention import launch_for  # noqa: E402

dev = torch.device("cuda" if CUDA else "cpu")
worst = 0.0
for heads, kv_heads, head_dim in ((32, 8, 128), (9, 3, 64)) if CUDA else ((8, 2, 128),):
    for batch, t in ((1, 1), (1, 16), (1, 65), (1, 257), (8, 17), (8, 65)) if CUDA else ((1, 9),):
        launch = launch_for(head_dim, heads // kv_heads * t, 4)
        row = splitkv_ab.point(heads, kv_heads, head_dim, batch, t, 1024 if CUDA else 70, [launch], dev,
                               dtype=torch.float32, timer=lambda fn: (0.0, fn()), flex=False)
        err = row["launches"][0]["max_abs_err"]
        worst = max(worst, err)
        print(f"float32 {heads}/{kv_heads}/{head_dim} batch {batch} T {t} {launch}: max abs err {err:.3g}", flush=True)
print(f"worst {worst:.3g}", "OK" if worst < 1e-4 else "TOO LARGE")

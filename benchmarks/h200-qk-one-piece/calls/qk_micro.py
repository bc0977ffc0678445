"""The q/k norm + rotary piece at Qwen3-8B's shape (32 + 8 heads of 128), N = 1, 16, 65 rows, CUDA graph replay:
two compiled pieces (q, k) vs one reduction with the cat weight vs one with a ready [H, D] weight."""
import sys
import torch
sys.path.insert(0, "benchmarks")
from tree_kernel_ab import time_graph
from treeflash.models.kernels import COMPILED, norm_rotary, _compiled

torch.manual_seed(0)
d, hq, hk = 128, 32, 8
qw, kw = torch.randn(d, device="cuda", dtype=torch.bfloat16), torch.randn(d, device="cuda", dtype=torch.bfloat16)
ready = torch.cat([qw.expand(hq, d), kw.expand(hk, d)]).contiguous()
for n in (1, 16, 65):
    qkv = torch.randn(1, n, hq + 2 * hk, d, device="cuda", dtype=torch.bfloat16)
    x = qkv[:, :, :hq + hk]
    cos, sin = torch.randn(1, n, d, device="cuda", dtype=torch.bfloat16), torch.randn(1, n, d, device="cuda", dtype=torch.bfloat16)
    two = lambda: (COMPILED.norm_rotary(x[:, :, :hq], qw, 1e-6, cos, sin), COMPILED.norm_rotary(x[:, :, hq:], kw, 1e-6, cos, sin))
    one = lambda: COMPILED.qk_norm_rotary(x, qw, kw, 1e-6, cos, sin, hq)
    def pre():
        c, s = (t.reshape(n, 1, d) for t in (cos, sin))
        torch._dynamo.maybe_mark_dynamic(x, 0)
        return _compiled(norm_rotary)(x.reshape(n, hq + hk, d), ready, 1e-6, c, s)
    for name, fn in (("two", two), ("one", one), ("ready", pre)):
        us, _ = time_graph(fn, reps=500)
        print(f"N {n} {name}: {us:.2f} us", flush=True)

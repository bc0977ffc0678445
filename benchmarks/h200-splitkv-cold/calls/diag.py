"""One splitkv call per shape (Qwen3-8B heads, context 1,024), twice, for ncu to profile (c4.sh); the compiled
kernels' registers, spills and shared memory are printed by variants.py."""
import sys

import torch

sys.path.insert(0, "benchmarks")
import treeflash.splitkv_attention as K  # noqa: E402
from sweep_cold import inputs  # noqa: E402  (the call's copy held the same function, one layer's cache)

if __name__ == "__main__":
    for batch, t in ((1, 65), (1, 1), (1, 257)):
        q, cache, seq32, mask8, new_k, new_v, want = inputs(batch, t, 1)
        for _ in range(2):
            K.splitkv_attention(q, cache.keys[0], cache.values[0], seq32, mask8, new_k, new_v)
        torch.cuda.synchronize()

"""One splitkv call per shape (Qwen3-8B heads, context 1,024) for ncu; prints each partial kernel's registers,
spills and shared memory as Triton compiled it."""
import sys

import torch

sys.path.insert(0, "benchmarks")
import treeflash.splitkv_attention as K  # noqa: E402
from splitkv_ab import tree_mask  # noqa: E402
from treeflash.attention import attend  # noqa: E402
from treeflash.kv_cache import KVCache, append_layout  # noqa: E402

DEV, DTYPE, LAYERS = torch.device("cuda"), torch.bfloat16, 1
heads, kv_heads, head_dim, context = 32, 8, 128, 1024


def inputs(batch, t, layers=1):
    gen = torch.Generator().manual_seed(batch * 1000 + t)
    capacity = context + 512
    q = torch.randn(batch, heads, t, head_dim, generator=gen).to(DEV, DTYPE)
    new_k, new_v = (torch.randn(batch, kv_heads, t, head_dim, generator=gen).to(DEV, DTYPE) for _ in range(2))
    cache = KVCache.allocate(layers, batch, kv_heads, capacity, head_dim, DTYPE, DEV)
    for tensor in cache.stacked:
        tensor.copy_(torch.randn(tensor.shape, generator=gen).to(DTYPE))
    seq_lens = torch.full((batch,), context, device=DEV)
    new_mask = tree_mask(batch, t, gen).to(DEV)
    rows, dense = append_layout(seq_lens, new_mask, capacity)
    want_k, want_v = cache.keys[0].float().clone(), cache.values[0].float().clone()
    for b in range(batch):
        want_k[b, :, rows[b]] = new_k[b].float()
        want_v[b, :, rows[b]] = new_v[b].float()
    want = attend(q.float(), want_k, want_v, dense)
    return q, cache, seq_lens.to(torch.int32), new_mask.to(torch.uint8), new_k, new_v, want



if __name__ == "__main__":
    for batch, t in ((1, 65), (1, 1), (1, 257)):
        q, cache, seq32, mask8, new_k, new_v, want = inputs(batch, t)
        for _ in range(2):
            K.splitkv_attention(q, cache.keys[0], cache.values[0], seq32, mask8, new_k, new_v)
        torch.cuda.synchronize()

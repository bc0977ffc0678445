"""The experimental partial kernel (exp2 + unmasked full tiles) against main's, over launches and split counts,
one splitkv call each (CUDA graph replays, us), Qwen3-8B heads, context 1,024. argv[1]: output JSON."""
import itertools
import json
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".stage/skv2")
from splitkv_ab import tree_mask  # noqa: E402
from tree_kernel_ab import time_graph  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
if not CUDA:
    sys.path.insert(0, "tests")
    from triton_interpreter import mend_interpreter
    mend_interpreter()
import skv_exp as K  # noqa: E402
from treeflash.attention import attend  # noqa: E402
from treeflash.kv_cache import KVCache, append_layout  # noqa: E402

DTYPE = torch.bfloat16 if CUDA else torch.float32
heads, kv_heads, head_dim = (32, 8, 128) if CUDA else (8, 2, 32)
context = 1024 if CUDA else 100
out = []


def inputs(batch, t):
    gen = torch.Generator().manual_seed(batch * 1000 + t)
    capacity = context + 512
    q = torch.randn(batch, heads, t, head_dim, generator=gen).to(DEV, DTYPE)
    new_k, new_v = (torch.randn(batch, kv_heads, t, head_dim, generator=gen).to(DEV, DTYPE) for _ in range(2))
    cache = KVCache.allocate(1, batch, kv_heads, capacity, head_dim, DTYPE, DEV)
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


def run(batch, t, launch, splits, exp2, full, args):
    q, cache, seq32, mask8, new_k, new_v, want = args

    def call():
        return K.splitkv_attention(q, cache.keys[0], cache.values[0], seq32, mask8, new_k, new_v, launch,
                                   splits=splits, exp2=exp2, full=full)
    try:
        err = (call().float() - want).abs().max().item()
        us = time_graph(call)[0] if CUDA else 0.0
    except Exception as e:  # a launch that does not compile (shared memory) is recorded, not fatal
        print("FAIL", batch, t, launch, splits, exp2, full, repr(e)[:200], flush=True)
        return
    row = {"batch": batch, "t": t, **launch.__dict__, "splits": splits, "exp2": exp2, "full": full,
           "us": us, "err": err}
    out.append(row)
    print(batch, t, (launch.max_block_m, launch.block_n, launch.num_warps, launch.num_stages), splits,
          "new" if exp2 else "old", f"{us:.1f} us err {err:.2g}", flush=True)


start = time.time()
variants = ((False, False), (True, True))
# The small shapes at launch_for's launch and the rule's split count, both kernels, plus exp2/full apart.
for batch, t in ((1, 1), (1, 16), (8, 1)) if CUDA else ((1, 1), (1, 5)):
    args = inputs(batch, t)
    for exp2, full in variants + ((True, False), (False, True)):
        run(batch, t, K.launch_for(head_dim, heads // kv_heads * t), None, exp2, full, args)
# The trees: a grid of launches x split counts, both kernels.
grid = itertools.product((32, 64, 128), (64, 128), (4, 8), (None, 2), (1, 2, 4)) if CUDA else \
    itertools.product((16, 32), (16, 32), (4,), (None,), (1, 2))
grid = list(grid)
for (batch, t), deadline in zip(((1, 65), (1, 257)) if CUDA else ((1, 9), (2, 9)), (260, 480)):
    args = inputs(batch, t)
    for m, n, w, st, sp in grid:
        if time.time() - start > deadline:
            print("out of time", flush=True)
            break
        for exp2, full in variants:
            run(batch, t, K.Launch(m, n, w, st), sp, exp2, full, args)
    print(f"{time.time() - start:.0f} s", flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
if CUDA:  # the tree points at main's launch_for and rule, for reference
    for batch, t in ((1, 65), (1, 257), (8, 65)):
        args = inputs(batch, t)
        for exp2, full in variants:
            run(batch, t, K.launch_for(head_dim, heads // kv_heads * t), None, exp2, full, args)
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(f"done {time.time() - start:.0f} s", flush=True)

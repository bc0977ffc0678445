"""splitkv launches x split counts, timed as the engine runs them: one call per layer over 36 layers' caches
(Qwen3-8B heads, context 1,024), so each call finds its KV rows out of L2 as in a round. One CUDA graph of
the 36 calls, replayed; us per call. argv[1]: output JSON."""
import json
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from splitkv_ab import tree_mask  # noqa: E402
from tree_kernel_ab import time_graph  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
if not CUDA:
    sys.path.insert(0, "tests")
    from triton_interpreter import mend_interpreter
    mend_interpreter()
import treeflash.splitkv_attention as K  # noqa: E402
from treeflash.attention import attend  # noqa: E402
from treeflash.kv_cache import KVCache, append_layout  # noqa: E402

DTYPE = torch.bfloat16 if CUDA else torch.float32
heads, kv_heads, head_dim = (32, 8, 128) if CUDA else (8, 2, 32)
context = 1024 if CUDA else 100
LAYERS = 36 if CUDA else 2
out = []
rule_splits = K.num_splits


def inputs(batch, t):
    gen = torch.Generator().manual_seed(batch * 1000 + t)
    capacity = context + 512
    q = torch.randn(batch, heads, t, head_dim, generator=gen).to(DEV, DTYPE)
    new_k, new_v = (torch.randn(batch, kv_heads, t, head_dim, generator=gen).to(DEV, DTYPE) for _ in range(2))
    cache = KVCache.allocate(LAYERS, batch, kv_heads, capacity, head_dim, DTYPE, DEV)
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


def run(batch, t, launch, splits, args, tag=""):
    q, cache, seq32, mask8, new_k, new_v, want = args
    K.num_splits = rule_splits if splits is None else (lambda *a, **k: splits)

    def one(layer):
        return K.splitkv_attention(q, cache.keys[layer], cache.values[layer], seq32, mask8, new_k, new_v, launch)

    def cold():
        return [one(layer) for layer in range(LAYERS)]
    try:
        err = (one(0).float() - want).abs().max().item()
        us = time_graph(cold, reps=20)[0] / LAYERS if CUDA else 0.0
        hot = time_graph(lambda: one(0))[0] if CUDA and tag else None
    except Exception as e:  # a launch that does not compile (shared memory) is recorded, not fatal
        print("FAIL", batch, t, launch, splits, repr(e)[:160], flush=True)
        return
    finally:
        K.num_splits = rule_splits
    out.append({"batch": batch, "t": t, **launch.__dict__, "splits": splits, "us": us, "hot_us": hot, "err": err,
                "tag": tag})
    print(batch, t, (launch.max_block_m, launch.block_n, launch.num_warps, launch.num_stages), splits,
          f"{us:.1f} us", "" if hot is None else f"(hot {hot:.1f})", f"err {err:.2g}", tag, flush=True)


start = time.time()
L = K.Launch
POINTS = {  # (batch, new tokens): [(launch, forced split counts)]
    (1, 65): [(K.MANY_ROWS_WIDE_HEADS, (2, 3, 4)), (L(64, 128, 4, 3, 1), (2, 3)), (L(32, 128, 4, 2, 1), (1, 2, 3))],
    (1, 1): [(K.FEW_ROWS_WIDE_HEADS, (8, 16, 17, 24, 32, 33)), (L(64, 64, 4), (16, 17))],
    (1, 16): [(K.FEW_ROWS_WIDE_HEADS, (4, 8, 9, 12, 16, 17, 32, 33))],
    (8, 1): [(K.FEW_ROWS_WIDE_HEADS, (2, 3, 4, 5, 8))],
    (1, 257): [(K.MOST_ROWS_WIDE_HEADS, (1, 2))],
} if CUDA else {(1, 9): [(K.Launch(16, 16), (1, 3))]}
for (batch, t), launches in POINTS.items():
    args = inputs(batch, t)
    run(batch, t, K.launch_for(head_dim, heads // kv_heads * t, 2, batch), None, args, tag="rule")
    for launch, splits in launches:
        for sp in splits:
            run(batch, t, launch, sp, args)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
print(f"done {time.time() - start:.0f} s", flush=True)

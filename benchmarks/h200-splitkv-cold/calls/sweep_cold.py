"""splitkv launches x split counts, timed as the engine runs them: one call per layer over 36 layers' caches
(Qwen3-8B heads, context 1,024), so each call finds its KV rows out of L2 as in a round. One CUDA graph of
the 36 calls, replayed; us per call. `python3 sweep_cold.py OUT.json [grid|c3|c5]`: call 2's grid (the
default), call 3's forced split counts (with merge_any_splits.patch applied: counts not a power of two),
call 5's one-stage launches. The calls ran this file's three parts as three scripts (sweep_cold.py,
sweep_splits.py twice, each with its own points); they are one file here, unchanged but for that."""
import itertools
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


def inputs(batch, t, layers=LAYERS):
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


def sweep_grid(start):
    for batch, t in ((1, 1), (1, 16), (8, 1), (1, 65), (1, 257), (8, 65)) if CUDA else ((1, 1), (1, 9)):
        run(batch, t, K.launch_for(head_dim, heads // kv_heads * t, 2, batch), None, inputs(batch, t), tag="rule")
    for (batch, t), deadline in zip(((1, 65), (1, 257), (1, 16)) if CUDA else ((1, 9),), (200, 370, 410)):
        args = inputs(batch, t)
        grid = [(m, n, 8 if m == 128 else 4, st, sp) for m, n, st, sp in
                itertools.product((64, 32, 128), (128, 64), (2, 3), (1, 2, 4, 8, 16))]
        if t == 16:
            grid = [(64, n, 4, st, sp) for n, st, sp in itertools.product((32, 64, 128), (None, 2), (4, 8, 16, 32))]
        if not CUDA:
            grid = [(16, 16, 4, None, sp) for sp in (1, 2, 4)]
        for m, n, w, st, sp in grid:
            if time.time() - start > deadline:
                print("out of time", flush=True)
                break
            run(batch, t, K.Launch(m, n, w, st), sp, args)
        print(f"{time.time() - start:.0f} s", flush=True)
        json.dump(out, open(sys.argv[1], "w"), indent=1)


L = K.Launch
POINTS_C3 = {  # (batch, new tokens): [(launch, forced split counts)]
    (1, 65): [(K.MANY_ROWS_WIDE_HEADS, (2, 3, 4)), (L(64, 128, 4, 3, 1), (2, 3)), (L(32, 128, 4, 2, 1), (1, 2, 3))],
    (1, 1): [(K.FEW_ROWS_WIDE_HEADS, (8, 16, 17, 24, 32, 33)), (L(64, 64, 4), (16, 17))],
    (1, 16): [(K.FEW_ROWS_WIDE_HEADS, (4, 8, 9, 12, 16, 17, 32, 33))],
    (8, 1): [(K.FEW_ROWS_WIDE_HEADS, (2, 3, 4, 5, 8))],
    (1, 257): [(K.MOST_ROWS_WIDE_HEADS, (1, 2))],
} if CUDA else {(1, 9): [(K.Launch(16, 16), (1, 3))]}
POINTS_C5 = {  # (batch, new tokens): [(launch, forced split counts)]; one pipeline stage: two programs an SM fit
    (1, 65): [(L(64, 128, 4, 1, 1), (2, 3, 4, 6, 8)), (L(32, 128, 4, 1, 1), (1, 2, 3, 4)),
              (L(64, 64, 4, 1, 1), (4, 8)), (L(64, 128, 8, 1, 1), (2, 4))],
    (1, 257): [(L(32, 128, 4, 1, 1), (1, 2)), (L(64, 128, 4, 1, 1), (1, 2)), (L(16, 128, 4, 1, 1), (1,))],
    (1, 16): [(L(64, 128, 4, 1, 1), (4, 8, 9))],
} if CUDA else {(1, 9): [(K.Launch(16, 16, 4, 1), (1, 3))]}


def sweep_points(points):
    for (batch, t), launches in points.items():
        args = inputs(batch, t)
        run(batch, t, K.launch_for(head_dim, heads // kv_heads * t, 2, batch), None, args, tag="rule")
        for launch, splits in launches:
            for sp in splits:
                run(batch, t, launch, sp, args)
        json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    start = time.time()
    part = sys.argv[2] if len(sys.argv) > 2 else "grid"
    if part == "grid":
        sweep_grid(start)
    else:
        sweep_points({"c3": POINTS_C3, "c5": POINTS_C5}[part])
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    print(f"done {time.time() - start:.0f} s", flush=True)

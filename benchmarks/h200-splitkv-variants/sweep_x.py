"""Cold timings (36 layers' caches, Qwen3-8B heads, context 1,024) of skv_x variants against main's kernel.
python3 benchmarks/h200-splitkv-variants/sweep_x.py OUT.json (from the repository root)"""
import json
import os
import sys
import time

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/h200-splitkv-cold/calls")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_cold as S  # noqa: E402  (its module code sets up CUDA/CPU shapes and the interpreter)
import skv_x as X  # noqa: E402
import treeflash.splitkv_attention as K  # noqa: E402

CUDA = S.CUDA
LAYERS = S.LAYERS
out = []
L = K.Launch


def point(batch, t, name, fn, args):
    q, cache, seq32, mask8, new_k, new_v, want = args
    try:
        info = []
        got = fn(q, cache.keys[0], cache.values[0], seq32, mask8, new_k, new_v, info)
        err = (got.float() - want).abs().max().item()
        meta = ""
        if info and CUDA:
            k = info[0]
            meta = f"regs {getattr(k, 'n_regs', '?')} spills {getattr(k, 'n_spills', '?')}"

        def cold():
            return [fn(q, cache.keys[i], cache.values[i], seq32, mask8, new_k, new_v, None) for i in range(LAYERS)]
        us = S.time_graph(cold, reps=20)[0] / LAYERS if CUDA else 0.0
    except Exception as e:
        print("FAIL", batch, t, name, repr(e)[:300], flush=True)
        out.append({"batch": batch, "t": t, "name": name, "fail": repr(e)[:300]})
        return
    out.append({"batch": batch, "t": t, "name": name, "us": us, "err": err, "meta": meta})
    print(batch, t, name, f"{us:.1f} us", f"err {err:.2g}", meta, flush=True)


def main_kernel(launch=None):
    def fn(q, k, v, s, m, nk, nv, info):
        return K.splitkv_attention(q, k, v, s, m, nk, nv, launch)
    return fn


def variant(launch, splits=None, **kw):
    def fn(q, k, v, s, m, nk, nv, info):
        return X.attention(q, k, v, s, m, nk, nv, launch, splits, info=info, **kw)
    return fn


start = time.time()
shapes = ((1, 65), (1, 257), (1, 16)) if CUDA else ((1, 9),)
for batch, t in shapes:
    args = S.inputs(batch, t)
    rows = S.heads // S.kv_heads * t
    rule = K.launch_for(S.head_dim, rows, 2 if CUDA else 4, batch)
    if not CUDA:
        rule = L(16, 16, 4, 2, 1)
    point(batch, t, "main", main_kernel(rule if not CUDA else None), args)
    point(batch, t, "x", variant(rule), args)
    for name, kw in (("pre", dict(prescale=True)), ("desc", dict(desc=True)), ("pre+desc", dict(prescale=True, desc=True)),
                     ("ws", dict(ws=True)), ("ws+desc", dict(ws=True, desc=True)),
                     ("ws+desc+pre", dict(ws=True, desc=True, prescale=True))):
        point(batch, t, name, variant(rule, **kw), args)
    if CUDA and t == 65:
        for launch, sp in ((L(64, 128, 8, 2, 1), 2), (L(64, 128, 8, 2, 1), 4), (L(64, 128, 8, 3, 1), 2),
                           (L(64, 128, 4, 3, 1), 2), (L(64, 128, 4, 2, 1), 4)):
            for name, kw in (("pre+desc", dict(prescale=True, desc=True)), ("ws+desc+pre", dict(ws=True, desc=True, prescale=True))):
                point(batch, t, f"{name} {launch.max_block_m},{launch.block_n},{launch.num_warps},{launch.num_stages} sp{sp}",
                      variant(launch, sp, **kw), args)
    if CUDA and t == 257:
        for launch, sp in ((L(64, 128, 8, 2, 1), 1), (L(64, 128, 8, 2, 1), 2), (L(32, 128, 4, 3, 1), 1)):
            point(batch, t, f"pre+desc {launch.max_block_m},{launch.block_n},{launch.num_warps},{launch.num_stages} sp{sp}",
                  variant(launch, sp, prescale=True, desc=True), args)
    print(f"{time.time() - start:.0f} s", flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)

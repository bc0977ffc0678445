"""splitkv at launch_for's launch with the KV split count forced (None: num_splits' rule) and the merge tile
varied, one call each (CUDA graph replays, us), Qwen3-8B and SmolLM2 heads, context 1,024."""
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
import splitkv_ab  # noqa: E402

import treeflash.splitkv_attention as K  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
if not CUDA:
    sys.path.insert(0, "tests")
    from triton_interpreter import mend_interpreter
    mend_interpreter()
rule = K.num_splits
out = []
for name, heads, kv_heads, head_dim in (("qwen3-8b", 32, 8, 128), ("smollm2-135m", 9, 3, 64)):
    for batch, t in ((1, 1), (1, 16), (1, 65), (1, 257), (8, 1), (8, 65)) if CUDA else ((1, 1), (1, 5)):
        launch = K.launch_for(head_dim, heads // kv_heads * t)
        for splits in (None, 1, 2, 4, 8, 16, 32):
            for tile in ((8192, 32768) if splits != 1 else (8192,)):
                K.num_splits = rule if splits is None else (lambda *a, s=splits, **k: s)
                K.MERGE_TILE = tile
                row = splitkv_ab.point(heads, kv_heads, head_dim, batch, t, 1024 if CUDA else 100, [launch], DEV,
                                       **({"flex": False} if CUDA else splitkv_ab.DRY_RUN))
                r = row["launches"][0]
                chosen = rule(batch * kv_heads * -(-(heads // kv_heads * t) // min(launch.max_block_m, max(
                    16, 1 << (heads // kv_heads * t - 1).bit_length()))), 1536, DEV, launch)
                out.append({"shape": name, "batch": batch, "t": t, "splits": splits or chosen, "rule": splits is None,
                            "merge_tile": tile, "us": r["us"], "err": r["max_abs_err"]})
                print(name, batch, t, "rule" if splits is None else "", splits or chosen, tile,
                      f"{r['us']:.1f} us err {r['max_abs_err']:.2g}", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)

"""splitkv at launch_for's launch and num_splits' rule, the merge kernel's tile (elements a program) varied."""
import sys

import torch

sys.path.insert(0, "benchmarks")
import splitkv_ab  # noqa: E402

import treeflash.splitkv_attention as K  # noqa: E402

for name, heads, kv_heads, head_dim in (("qwen3-8b", 32, 8, 128), ("smollm2-135m", 9, 3, 64)):
    for batch, t in ((1, 1), (1, 16), (1, 33), (1, 65), (8, 1), (8, 17)):
        launch = K.launch_for(head_dim, heads // kv_heads * t)
        line = []
        for tile in (1024, 2048, 4096, 8192):
            K.MERGE_TILE = tile
            row = splitkv_ab.point(heads, kv_heads, head_dim, batch, t, 1024, [launch], torch.device("cuda"), flex=False)
            line.append(f"{tile}: {row['launches'][0]['us']:.1f}")
        print(name, batch, t, " ".join(line), flush=True)

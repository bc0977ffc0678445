"""Leave-one-out timings of the partial kernel (skv_var.py: 0 as landed, 1 no softmax, 2 no PV dot, 3 no rescale),
cold over 36 layers' caches, Qwen3-8B heads, context 1,024, at the rule's launch and splits; with each compiled
kernel's registers, spills and shared memory. Outputs are wrong for variants 1-3 by design."""
import sys


sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".stage/cold")
from tree_kernel_ab import time_graph  # noqa: E402
from sweep_cold import inputs  # noqa: E402
import skv_var as V  # noqa: E402

LAYERS = 36
for batch, t in ((1, 65), (1, 1), (1, 257), (1, 16)):
    q, cache, seq32, mask8, new_k, new_v, want = inputs(batch, t, LAYERS)
    for variant in (0, 1, 2, 3):
        info = []
        V.splitkv_attention(q, cache.keys[0], cache.values[0], seq32, mask8, new_k, new_v, variant=variant, info=info)
        k = info[0]
        meta = f"regs {getattr(k, 'n_regs', '?')} spills {getattr(k, 'n_spills', '?')} " \
               f"shared {getattr(getattr(k, 'metadata', None), 'shared', '?')}"

        def cold():
            return [V.splitkv_attention(q, cache.keys[i], cache.values[i], seq32, mask8, new_k, new_v, variant=variant)
                    for i in range(LAYERS)]
        us = time_graph(cold, reps=20)[0] / LAYERS
        print(batch, t, "variant", variant, f"{us:.1f} us", meta, flush=True)

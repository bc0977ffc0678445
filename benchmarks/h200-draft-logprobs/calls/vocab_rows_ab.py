"""The vocab-row kernels (treeflash/vocab_rows.py) against torch's, one call each (CUDA graph replays, us): the draft
log-softmax (torch: float32 copy + log_softmax) over bf16 logits [S, 15, V], and the row maxima (torch: argmax of
the bf16 logits, as derive ran before; max of float32 log-probs, as the chain did) over [S, N, V]; their largest
difference and whether the argmax agrees. argv[1]: output JSON."""
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
from tree_kernel_ab import time_graph  # noqa: E402
from treeflash.vocab_rows import log_softmax_rows, max_rows  # noqa: E402

out = []


def record(row):
    out.append(row)
    print(row, flush=True)


for slots, vocab in ((1, 151936), (8, 151936), (32, 151936), (1, 16384), (32, 16384), (1, 49152)):
    gen = torch.Generator().manual_seed(slots)
    x = (torch.randn(slots, 15, vocab, generator=gen) * 4).to("cuda", torch.bfloat16)
    temp = torch.rand(slots, generator=gen).cuda() + 0.5
    for tempered in (False, True):
        t = temp if tempered else None
        torch_fn = (lambda: torch.log_softmax(x.float() / t[:, None, None], -1)) if tempered else \
            (lambda: torch.log_softmax(x.float(), -1))
        ours = lambda: log_softmax_rows(x, t)  # noqa: E731
        record({"op": "log_softmax", "slots": slots, "vocab": vocab, "tempered": tempered,
                "torch_us": time_graph(torch_fn)[0], "kernel_us": time_graph(ours)[0],
                "max_diff": (ours() - torch_fn()).abs().max().item(),
                "same_argmax": bool(torch.equal(ours().argmax(-1), torch_fn().argmax(-1)))})
for slots, nodes, vocab in ((1, 1, 151936), (1, 16, 151936), (1, 65, 151936), (1, 257, 151936), (8, 65, 151936),
                            (32, 17, 151936), (1, 65, 49152), (32, 65, 49152)):
    gen = torch.Generator().manual_seed(nodes)
    x = (torch.randn(slots, nodes, vocab, generator=gen) * 4).to("cuda", torch.bfloat16)
    ours = lambda: max_rows(x)[1]  # noqa: E731
    record({"op": "argmax", "slots": slots, "nodes": nodes, "vocab": vocab,
            "torch_us": time_graph(lambda: x.argmax(-1))[0], "kernel_us": time_graph(ours)[0],
            "same": bool(torch.equal(ours(), x.argmax(-1)))})
    lp = torch.log_softmax(x[:, :15].float(), -1)
    record({"op": "max", "slots": slots, "depths": lp.shape[1], "vocab": vocab,
            "torch_us": time_graph(lambda: lp.max(dim=-1))[0], "kernel_us": time_graph(lambda: max_rows(lp))[0],
            "same": all(torch.equal(a, b) for a, b in zip(max_rows(lp), lp.max(dim=-1)))})
json.dump(out, open(sys.argv[1], "w"), indent=1)

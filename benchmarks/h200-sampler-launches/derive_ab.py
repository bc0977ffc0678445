"""derive() for sampled rows before and after the uniforms became one Triton kernel and the per-node
parameters views: CUDA-graph time per call at SmolLM2's and Qwen3's vocabularies, and a bit-for-bit check of
the kernel's uniforms against the PyTorch path on the CPU.
PYTHONPATH=$PWD python3 benchmarks/h200-sampler-launches/derive_ab.py OUT.json"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tree_kernel_ab import time_graph  # noqa: E402  (CUDA-graph replays, the median of five batches)
from treeflash import sampling  # noqa: E402
from treeflash.sampling import SamplingParams, SamplingTensors, derive  # noqa: E402


def torch_uniforms(seed, positions):
    # sampling.draw_uniforms's PyTorch path, on any device (the ops as they ran on CUDA before).
    h = sampling._fmix32((positions & sampling._MASK32) ^ 0x9E3779B9)
    h = sampling._fmix32(h ^ seed[:, :1])
    h = sampling._fmix32(h ^ seed[:, 1:])
    high, low = sampling._fmix32(h ^ 0x7F4A7C15), sampling._fmix32(h ^ 0x2545F491)
    return ((((high << 20) | (low >> 12)) << 1) | 1).double() * 2.0 ** -53


def derive_before(logits, st, positions):
    # derive as it was: a gather per parameter for the per-node rows, the uniforms as PyTorch ops.
    greedy_tokens = sampling.vocab_max(logits)[1]
    slots, nodes = logits.shape[:2]
    per_node = st.rows(torch.arange(slots, device=logits.device)[:, None].expand(slots, nodes))
    probs = sampling.processed_probs(logits, per_node)
    sampled = sampling.sample_from(probs, torch_uniforms(st.seed, positions))
    return torch.where(st.greedy[:, None], greedy_tokens, sampled)


def main():
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    seed = torch.randint(0, 1 << 32, (64, 2), generator=gen)
    positions = torch.randint(0, 1 << 40, (64, 257), generator=gen)
    same = torch.equal(sampling.draw_uniforms(seed.to(dev), positions.to(dev)).cpu(),
                       sampling.draw_uniforms(seed, positions))
    print("CUDA kernel uniforms == CPU PyTorch uniforms:", same, flush=True)
    out = {"uniforms_bit_equal": same, "rows": []}
    for name, params in (("T=1", SamplingParams(temperature=1.0)),
                         ("T=0.7 top_p=0.9", SamplingParams(temperature=0.7, top_p=0.9))):
        for slots, nodes, vocab in ((1, 1, 49152), (1, 65, 49152), (1, 1, 151936), (1, 65, 151936),
                                    (8, 65, 151936)):
            st = SamplingTensors.build([params] * slots, list(range(slots)), dev)
            logits = torch.randn(slots, nodes, vocab, device=dev, dtype=torch.bfloat16) * 3
            pos = torch.arange(nodes, device=dev)[None].expand(slots, nodes) + 500
            a = derive_before(logits, st, pos)
            b = derive(logits, st, pos)
            row = {"params": name, "slots": slots, "nodes": nodes, "vocab": vocab, "same_tokens": torch.equal(a, b),
                   "before_us": time_graph(lambda: derive_before(logits, st, pos), reps=50)[0],
                   "after_us": time_graph(lambda: derive(logits, st, pos), reps=50)[0]}
            out["rows"].append(row)
            print(f"{name:16s} S={slots} N={nodes:3d} V={vocab:6d}: before {row['before_us']:7.1f} us, "
                  f"after {row['after_us']:7.1f} us, same tokens {row['same_tokens']}", flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()

"""Whether the thread count changes a float32 forward's bits on this CPU: the embedded SmolLM2-135M's logits
for 1, 9 and 40 random tokens (causal), computed on 1 and on 2 threads.

    python benchmarks/cpu-threads/rounding.py
"""
import torch

from treeflash.checkpoint import load_target
from treeflash.kv_cache import PrefixKV
from treeflash.llm import resolve_model_dir

model, _ = load_target(resolve_model_dir(None), torch.device("cpu"), torch.float32)
gen = torch.Generator().manual_seed(0)
for tokens in (1, 9, 40):
    ids = torch.randint(0, model.embed_tokens.weight.shape[0], (1, tokens), generator=gen)
    mask = torch.ones(tokens, tokens, dtype=torch.bool).tril()[None]
    logits = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with torch.inference_mode():
            hidden, _ = model(ids, torch.arange(tokens)[None], PrefixKV(), None, mask)
            logits.append(model.logits(hidden))
    diff = (logits[0] - logits[1]).abs().max().item()
    print(f"{tokens} tokens: " + ("the same bits" if torch.equal(*logits) else f"largest difference {diff:.3g}"))

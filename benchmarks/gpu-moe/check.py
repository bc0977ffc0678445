"""Mixtures of experts on CUDA: a tiny random float32 Qwen3-MoE target, its logits against transformers' on the
same GPU, and greedy decoding through the engine (CUDA graphs) with and without a random DFlash drafter.

16 experts, 2 per token, layer 1 dense: in float32 (no grouped product there) a forward of one or two tokens
takes the gemv plan's Triton kernels (N k <= E / 4; the gathered plan before them) and a verify or a larger batch
the dense one (treeflash/models/layers.py: SparseMoE), so both run under graphs. For every prompt the
tokens of plain decoding alone (batch 1) are the reference; plain decoding in a batch of 4, the DFlash chain
and DDTree-16 (batch 4) are compared with it, and plain decoding with transformers' generate.

    python benchmarks/gpu-moe/check.py --out check.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the script")
    args = parser.parse_args()

    import torch

    from helpers import hf_model, make_tiny_target
    from spec_helpers import make_drafter
    from treeflash import LLM, SamplingParams
    from treeflash.checkpoint import load_target
    from treeflash.kv_cache import append_layout

    folder = Path(tempfile.mkdtemp())
    target = make_tiny_target(folder / "target", "qwen3_moe", vocab_size=128, hidden_size=64, num_layers=3,
                              num_heads=4, num_kv_heads=2, intermediate_size=96, num_experts=16,
                              num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                              mlp_only_layers=[1], max_position_embeddings=512, seed=7)
    drafter = make_drafter(folder / "drafter", target, block_size=8)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 127, (n,), generator=gen).tolist() for n in (3, 9, 17, 30, 5, 64, 1, 12)]
    n = args.max_tokens
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    result = {"command": " ".join(["python", "benchmarks/gpu-moe/check.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%d %H:%M"), "device": args.device, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
              "prompts": len(prompts), "max_tokens": n}

    # logits against transformers, one prompt, on the same device
    model, _ = load_target(target, args.device, torch.float32)
    ids = prompts[5]
    with torch.no_grad():
        cache = model.new_cache(1, 128)
        rows, mask = append_layout(torch.tensor([0], device=args.device),
                                   torch.ones(1, len(ids), len(ids), dtype=torch.bool, device=args.device).tril(),
                                   len(ids))
        hidden, _ = model(torch.tensor([ids], device=args.device), rows, cache, rows, mask)
        ours = model.logits(hidden)[0].float().cpu()
        hf = hf_model(target).to(args.device)
        theirs = hf(torch.tensor([ids], device=args.device)).logits[0].float().cpu()
        x = torch.tensor([prompts[1]], device=args.device)
        hf_tokens = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                min_new_tokens=n, eos_token_id=None, pad_token_id=0)[0, x.shape[1]:].tolist()
    result["logits_max_abs_diff_vs_transformers"] = float((ours - theirs).abs().max())
    del model, hf

    def run(batch: int, **options) -> list[list[int]]:
        llm = LLM(str(target), device=args.device, dtype="float32", max_num_seqs=batch, **options)
        if batch == 1:
            return [llm.generate(prompt_token_ids=[p], sampling_params=params, use_tqdm=False)[0].token_ids
                    for p in prompts]
        return [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)]

    alone = run(1, spec="none")
    result["plain_equals_transformers_generate"] = alone[1] == hf_tokens
    runs = {"plain, batch 4": run(4, spec="none"),
            "dflash, batch 4": run(4, spec="dflash", draft_model=str(drafter)),
            "ddtree-16, batch 4": run(4, spec="ddtree", tree_budget=16, draft_model=str(drafter)),
            "ddtree-16, batch 1": run(1, spec="ddtree", tree_budget=16, draft_model=str(drafter))}
    result["equal_to_plain_alone"] = {name: sum(a == b for a, b in zip(got, alone)) for name, got in runs.items()}
    ok = (all(v == len(prompts) for v in result["equal_to_plain_alone"].values())
          and result["plain_equals_transformers_generate"] and result["logits_max_abs_diff_vs_transformers"] < 1e-3)
    result["ok"] = ok
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

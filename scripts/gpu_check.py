"""Behaviour checks on a CUDA device (run on the lent H200 through the device tool).

Not a benchmark: it checks that the CUDA path is the same engine as the CPU path. Prints a table and
writes a JSON file.

  python scripts/gpu_check.py --out results/gpu_check.json [--smollm2 /path/SmolLM2-135M-Instruct.Q4_1.gguf]

A. tiny random Llama / Qwen2 / Qwen3 (float32): greedy tokens identical to transformers on the GPU.
B. tiny random DFlash drafter: dflash and ddtree greedy identical to plain decoding; seeded sampling
   reproducible alone and inside a mixed batch, and identical to plain sampling with the same seed.
C. no host synchronisation inside a round: every round runs under
   torch.cuda.set_sync_debug_mode("error") (greedy + sampled rows, top-k/top-p/min-p on).
D. with --smollm2: the real model, greedy float32 identical to transformers on the GPU, and bf16 runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treeflash import LLM, SamplingParams  # noqa: E402
from treeflash.models.dflash import DFlashDrafter, DrafterConfig, save_drafter  # noqa: E402
from treeflash.round import Speculator  # noqa: E402
from treeflash.sampling import SamplingTensors  # noqa: E402

PROMPTS = [[5, 17, 42, 8, 99, 3], [1, 2, 3], [7] * 20]
DEVICE = "cuda"  # --device cpu runs A, B and D here, to check the script itself


def tiny_targets(root: Path) -> dict[str, Path]:
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    out = {}
    for name, config_cls, model_cls in [("llama", LlamaConfig, LlamaForCausalLM), ("qwen2", Qwen2Config, Qwen2ForCausalLM),
                                        ("qwen3", Qwen3Config, Qwen3ForCausalLM)]:
        torch.manual_seed(0)
        cfg = config_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=512,
                         tie_word_embeddings=name == "llama")
        model_cls(cfg).save_pretrained(root / name)
        out[name] = root / name
    return out


def tiny_drafter(root: Path, block_size: int = 8) -> Path:
    torch.manual_seed(1)
    cfg = DrafterConfig.from_hf({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block_size,
        "dflash_config": {"mask_token_id": 299, "target_layer_ids": [0, 2]}, "num_target_layers": 3,
        "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": 512})
    return save_drafter(DFlashDrafter(cfg), root / "drafter")


def hf_greedy(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(DEVICE).eval()
    ids = torch.tensor([prompt], device=DEVICE)
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                         attention_mask=torch.ones_like(ids))
    return out[0, len(prompt):].tolist()


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def check_parity(targets: dict[str, Path]) -> dict:
    results = {}
    for name, path in targets.items():
        llm = LLM(path, device=DEVICE, dtype="float32")
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=greedy(32))
        results[name] = all(o.token_ids == hf_greedy(path, p, 32) for o, p in zip(outs, PROMPTS))
    return results


def check_speculative(target: Path, drafter: Path) -> dict:
    params = [greedy(40), greedy(25), greedy(33)]
    ref = LLM(target, device=DEVICE, dtype="float32").generate(prompt_token_ids=PROMPTS, sampling_params=params)
    results = {}
    for spec, budget in [("dflash", 64), ("ddtree", 4), ("ddtree", 16), ("ddtree", 64)]:
        llm = LLM(target, device=DEVICE, dtype="float32", draft_model=drafter, spec=spec, tree_budget=budget,
                  max_num_seqs=2)
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
        results[f"{spec}-{budget} greedy == none"] = all(o.token_ids == r.token_ids for o, r in zip(outs, ref))
    llm = LLM(target, device=DEVICE, dtype="float32", draft_model=drafter, spec="ddtree", tree_budget=16)
    seeded = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=30, seed=1234, ignore_eos=True)
    alone = llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=seeded)[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=20, seed=7, ignore_eos=True), greedy(12)]
    mixed = llm.generate(prompt_token_ids=[PROMPTS[1], PROMPTS[0], PROMPTS[2]],
                         sampling_params=[others[0], seeded, others[1]])[1].token_ids
    results["seeded sample reproducible alone / in a mixed batch"] = alone == mixed
    plain = LLM(target, device=DEVICE, dtype="float32").generate(prompt_token_ids=PROMPTS[:1], sampling_params=seeded)
    results["seeded sample identical with spec=none and ddtree"] = plain[0].token_ids == alone
    return results


def check_no_sync(target: Path, drafter: Path) -> dict:
    results = {}
    for spec in ("none", "dflash", "ddtree"):
        llm = LLM(target, device=DEVICE, dtype="float32", draft_model=None if spec == "none" else drafter, spec=spec,
                  tree_budget=32, time_stages=False)
        speculator = Speculator(llm.model, llm.drafter, llm.spec, slots=4, capacity=256, time_stages=False)
        params = [greedy(8), SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, seed=1),
                  SamplingParams(temperature=1.0, seed=2), greedy(8)]
        for slot, prompt in enumerate(PROMPTS + PROMPTS[:1]):
            speculator.prefill(slot, prompt)
            speculator.set_bonus(slot, 11)
        sampling = SamplingTensors.build(params, [0, 1, 2, 3], DEVICE)
        torch.cuda.synchronize()
        ok = True
        try:
            torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
            for _ in range(3):
                speculator.round(4, sampling, kv_bound=64)
        except RuntimeError as e:
            ok = f"sync inside a round: {e}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
        results[f"{spec}: 3 rounds without host sync"] = ok
    return results


def check_smollm2(gguf: Path) -> dict:
    from transformers import AutoModelForCausalLM

    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
    llm = LLM(gguf, device=DEVICE, dtype="float32")
    outs = llm.generate(prompts, greedy(32))
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).to(DEVICE).eval()
    same = []
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids], device=DEVICE)
        r = ref.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0,
                         attention_mask=torch.ones_like(ids))
        same.append(out.token_ids == r[0, ids.shape[1]:].tolist())
    bf16 = LLM(gguf, device=DEVICE, dtype="bfloat16")
    start = time.perf_counter()
    reply = bf16.chat([{"role": "user", "content": "Write a haiku about trees"}], SamplingParams(temperature=0, max_tokens=64))[0]
    seconds = time.perf_counter() - start
    return {"smollm2 float32 greedy == transformers (3 prompts)": all(same),
            "smollm2 bf16 chat reply": reply.text[:120],
            "smollm2 bf16 eager tokens/s (informational, batch 1, no CUDA graphs)": round(len(reply.token_ids) / seconds, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", type=Path, default=None, help="path of the SmolLM2 GGUF on the GPU machine")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--skip-tiny", action="store_true", help="run only D (the SmolLM2 checks)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    cuda = DEVICE == "cuda"
    assert not cuda or torch.cuda.is_available(), "needs a CUDA device"
    results = {"device": torch.cuda.get_device_name() if cuda else DEVICE, "torch": torch.__version__}
    if not args.skip_tiny:
        with tempfile.TemporaryDirectory() as tmp:
            targets = tiny_targets(Path(tmp))
            drafter = tiny_drafter(Path(tmp))
            results["A. parity with transformers (fp32)"] = check_parity(targets)
            results["B. speculative greedy and seeded sampling"] = check_speculative(targets["qwen3"], drafter)
            if cuda:
                results["C. host synchronisation"] = check_no_sync(targets["qwen3"], drafter)
    if args.smollm2:
        results["D. SmolLM2-135M-Instruct"] = check_smollm2(args.smollm2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    failed = [k for section in results.values() if isinstance(section, dict) for k, v in section.items() if v is False
              or (isinstance(v, str) and v.startswith("sync inside"))]
    print("FAILED: " + ", ".join(failed) if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

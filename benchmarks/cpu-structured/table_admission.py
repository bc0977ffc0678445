"""What admitting a structured request costs the automata's table (`GrammarSlots.start`), on the CPU.

Eight requests of one JSON-object structure (SmolLM2's vocabulary: 1,623 states, 3.3 million transitions)
start one by one in eight slots, then each in turn ends and another of the same structure takes its slot.
`--old FILE` times a second `structured.py` beside this one's (e.g. `git show bf5859c:treeflash/structured.py`,
the table that copied each slot's automaton and rebuilt itself at each admission).

    python benchmarks/cpu-structured/table_admission.py [--old /tmp/old_structured.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

import torch

from treeflash.checkpoint import load_tokenizer, resolve_model_dir
from treeflash.structured import GrammarCompiler, GrammarSlots, StructuredOutputsParams


def time_table(slots_class, grammar, slots: int = 8) -> dict:
    table = slots_class(slots, grammar.vocab_size, "cpu")
    begin = time.perf_counter()
    for slot in range(slots):
        table.start([slot], [grammar])
    first = time.perf_counter() - begin
    begin = time.perf_counter()
    for slot in range(slots):
        table.start([slot], [None])
        table.start([slot], [grammar])
    return {"first_admissions_s": first, "replacement_ms": (time.perf_counter() - begin) / slots * 1e3,
            "table_MB": (table.allowed.numel() + table.keys.numel() * 16) / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", default=None, help="another structured.py to time beside this one")
    args = ap.parse_args()
    torch.set_num_threads(2)
    tokenizer = load_tokenizer(resolve_model_dir(None))  # the embedded SmolLM2-135M-Instruct
    grammar = GrammarCompiler(tokenizer, 49152).compile(StructuredOutputsParams(json_object=True), frozenset({2}))
    rows = {"this": time_table(GrammarSlots, grammar)}
    if args.old:
        spec = importlib.util.spec_from_file_location("old_structured", args.old)
        old = sys.modules["old_structured"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        rows["old"] = time_table(old.GrammarSlots, old.Grammar(grammar.vocab_size, grammar.initial, grammar.allowed,
                                                               grammar.keys, grammar.next))
    for name, r in rows.items():
        print(f"{name}: 8 first admissions {r['first_admissions_s']:.3f} s, then one replacement "
              f"{r['replacement_ms']:.2f} ms; the table {r['table_MB']:.0f} MB")


if __name__ == "__main__":
    main()

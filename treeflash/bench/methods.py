"""The methods a benchmark compares, written `none`, `dflash`, `ddtree:64`, `ddtree:auto`; `/sync` after any
of them (`ddtree:64/sync`) runs it with every round read back before the next is launched
(`LLM(overlap=False)`), to compare with the engine's default in one run; `/ngram` grafts prompt lookup
onto its rounds (`LLM(ngram_tokens=...)`, the bench's --ngram-tokens), and both may follow (`none/ngram/sync`).
A method without /ngram runs without lookup on every device, so a label means the same rounds everywhere; the
engine's default with a drafter is the /ngram one (`ddtree:auto/ngram`: `lookup.default_tokens`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from treeflash.lookup import DEFAULT_TOKENS
from treeflash.round import SpecConfig

NGRAM_TOKENS = DEFAULT_TOKENS  # prompt-lookup tokens a round of a /ngram method, unless the bench says otherwise


@dataclass(frozen=True)
class Method:
    label: str  # as the user wrote it, normalised: "none", "dflash", "ddtree:64", "ddtree:auto", "none/sync"
    spec: str  # "none", "dflash" or "ddtree"
    budget: int | str | None = None  # ddtree only: draft nodes per round, or "auto"
    sync: bool = False  # rounds without overlap (LLM(overlap=False)); False: the engine's default
    ngram: bool = False  # prompt lookup grafted onto the rounds (LLM(ngram_tokens=...))

    def nodes(self, depth: int) -> int:
        """Draft nodes per round (the chain has one per depth; auto is unknown here, counted as 0)."""
        if self.spec == "dflash":
            return depth
        return self.budget if isinstance(self.budget, int) else 0

    def spec_config(self, ngram_tokens: int = NGRAM_TOKENS) -> SpecConfig:
        return SpecConfig(method=self.spec, tree_budget=self.budget if self.spec == "ddtree" else 64,
                          ngram_tokens=ngram_tokens if self.ngram else 0)

    def llm_kwargs(self, ngram_tokens: int = NGRAM_TOKENS) -> dict:
        """Keyword arguments for `LLM(...)`; tree_budget="auto" where the engine supports it; `ngram_tokens`
        always (0 unless /ngram), as the engine's default with a drafter has lookup on."""
        kwargs = {"spec": self.spec, "ngram_tokens": ngram_tokens if self.ngram else 0}
        if self.spec == "ddtree":
            kwargs["tree_budget"] = self.budget
        if self.sync:
            kwargs["overlap"] = False
        return kwargs


def parse_method(text: str) -> Method:
    base, *suffixes = text.strip().lower().split("/")
    if any(s not in ("sync", "ngram") for s in suffixes) or len(set(suffixes)) < len(suffixes):
        raise ValueError(f"method {text!r}: the suffixes are /ngram and /sync, once each (e.g. ddtree:64/sync)")
    name, _, budget = base.partition(":")
    if name in ("none", "dflash"):
        if budget:
            raise ValueError(f"method {text!r}: only ddtree takes a budget (ddtree:64, ddtree:auto)")
        method = Method(name, name)
    elif name != "ddtree":
        raise ValueError(f"unknown method {text!r}: use none, dflash, ddtree:BUDGET or ddtree:auto")
    elif budget == "auto":
        method = Method("ddtree:auto", "ddtree", "auto")
    elif not budget.isdigit() or int(budget) < 1:
        raise ValueError(f"method {text!r}: ddtree needs a positive budget, e.g. ddtree:64 (or ddtree:auto)")
    else:
        method = Method(f"ddtree:{int(budget)}", "ddtree", int(budget))
    if "ngram" in suffixes:
        method = replace(method, label=f"{method.label}/ngram", ngram=True)
    return replace(method, label=f"{method.label}/sync", sync=True) if "sync" in suffixes else method


def parse_methods(text: str) -> list[Method]:
    """A comma-separated list of methods, duplicates dropped, order kept."""
    methods, seen = [], set()
    for part in text.split(","):
        if not part.strip():
            continue
        m = parse_method(part)
        if m.label not in seen:
            seen.add(m.label)
            methods.append(m)
    if not methods:
        raise ValueError("no methods given (e.g. --methods none,dflash,ddtree:64)")
    return methods


def budgets_of(methods: list[Method]) -> list[int]:
    return [m.budget for m in methods if m.spec == "ddtree" and isinstance(m.budget, int)]

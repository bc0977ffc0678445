"""What a finished request returns (vLLM-like) and what was measured while it ran."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from treeflash.logprobs import Logprob


def plural(n: int, word: str) -> str:
    """'1 round', '3 rounds'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass
class RequestMetrics:
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens not prefilled: an earlier prompt's rows held them (prefix reuse)
    # Tokens emitted per round: accepted drafts + 1, less what a stop or max_tokens cut from the last round,
    # so they sum to the generated tokens less the first (which prefill emits).
    acceptance_lengths: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0  # wall time of the prefill forwards this request took part in (batched)
    decode_seconds: float = 0.0  # wall time of the rounds this request took part in
    stage_seconds: dict[str, float] = field(default_factory=dict)  # per round stage, summed
    round_budgets: list[int] = field(default_factory=list)  # tree_budget="auto": each round's budget (0: no draft)

    @property
    def rounds(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def mean_acceptance_length(self) -> float:
        """Mean tokens per round (tau); 1.0 for autoregressive decoding."""
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else 0.0

    @property
    def tokens_per_second(self) -> float:
        total = self.prefill_seconds + self.decode_seconds
        return self.num_generated_tokens / total if total > 0 else 0.0

    def budget_counts(self) -> str:
        """tree_budget="auto": rounds per budget it chose, e.g. "auto budgets: 0 x3, 8 x12"."""
        counts = Counter(self.round_budgets)
        return "auto budgets: " + ", ".join(f"{b} x{counts[b]}" for b in sorted(counts))

    def summary(self) -> str:
        parts = [plural(self.num_generated_tokens, "token"), f"{self.tokens_per_second:.1f} tokens/s",
                 f"prefill {self.prefill_seconds * 1e3:.0f} ms"]
        if self.rounds:
            parts.append(f"{plural(self.rounds, 'round')}, mean acceptance length {self.mean_acceptance_length:.2f}")
        if self.round_budgets:
            parts.append(self.budget_counts())
        if self.stage_seconds:
            total = sum(self.stage_seconds.values()) or 1.0
            parts.append("stages: " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in self.stage_seconds.items()))
        return " | ".join(parts)


@dataclass
class CompletionOutput:
    """One completion of a prompt (vLLM's): `RequestOutput.outputs[index]`, one per SamplingParams.n."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str
    stop_reason: int | str | None = None
    metrics: RequestMetrics | None = None  # (treeflash's: what was measured while this completion ran)


@dataclass
class RequestOutput:
    """A prompt's result. Its fields are its first completion's; `outputs` holds every completion
    (SamplingParams.n of them, vLLM's layout: `output.outputs[0].text` is `output.text`)."""

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated ids only
    text: str
    finish_reason: str  # "stop" or "length"
    metrics: RequestMetrics
    last_tree: str | None = None  # the last round's tree, drawn, when the engine records trees
    # SamplingParams.logprobs set: per generated token {token id: Logprob}, the token first, then the most likely
    # ones (vLLM's SampleLogprobs; treeflash/logprobs.py); None otherwise.
    logprobs: list[dict[int, Logprob]] | None = None
    # SamplingParams.prompt_logprobs set: one entry per prompt token, None for the first (nothing predicts it),
    # then {token id: Logprob} as above (vLLM's PromptLogprobs); None otherwise.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    # What ended a request whose finish_reason is "stop" (vLLM's): the stop string, or the stop token's id from
    # stop_token_ids; None for EOS (and for "length")
    stop_reason: int | str | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)  # (empty given: this one completion)

    def __post_init__(self) -> None:
        if not self.outputs:
            self.outputs = [self.completion(0)]

    @property
    def cumulative_logprob(self) -> float | None:
        """The generated tokens' summed log-probs (with logprobs asked for), as vLLM reports it."""
        if self.logprobs is None:
            return None
        return sum(entry[token].logprob for token, entry in zip(self.token_ids, self.logprobs))

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens whose rows an earlier prompt's prefill left in the caches, so they were not prefilled
        again (vLLM's field; prefix reuse, treeflash/prefix_reuse.py)."""
        return self.metrics.num_cached_tokens

    @property
    def finished(self) -> bool:
        """Always True: generate returns finished requests (vLLM's field, which streaming outputs leave False)."""
        return True

    def completion(self, index: int) -> CompletionOutput:
        """This output's completion, as the index-th of its prompt's."""
        return CompletionOutput(index, self.text, self.token_ids, self.cumulative_logprob, self.logprobs,
                                self.finish_reason, self.stop_reason, self.metrics)

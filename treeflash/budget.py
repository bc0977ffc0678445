"""tree_budget="auto": pick the draft-tree budget that maximises expected tokens per second.

The rule (for the running batch, re-decided every round, on the host, from values the round's one
synchronisation already copied):

    budget = argmax_B  (1 + r * m(B)) / cost(S, B)       over B in AUTO_BUDGETS

- cost(S, B): seconds per round at budget B for batch bucket S, from a `CostProfile` measured on the
  device the first time bucket S runs (on a GPU, CUDA graph replays with the slots' state restored
  afterwards; on the CPU, the first real rounds of bucket S, one at each candidate budget, largest
  first, then one without a draft) or loaded from a stored profile. Budgets not measured are
  interpolated linearly between measured ones (and extrapolated from the last two).
- m(B): the drafts a round at budget B is expected to accept, under the drafter's own surrogate. The
  tree's node scores are log-probabilities of prefixes, and a prefix is accepted exactly when it is
  the target's continuation, so E[accepted drafts] = sum over nodes of P(prefix) ~ sum exp(score).
  The builder ranks every candidate of its per-depth beams (tree.DraftTree.ranked_scores); the
  cumulative sum of exp(score) over the first B of them is m(B). For B up to the budget in use it is
  exact; past it, it is a lower bound (a beam holds only the current budget's best prefixes per
  depth, and a round below the block's depth drafts only the depths its budget can reach), so the
  rule grows the budget cautiously. m is averaged over running slots and rounds (EMA).
- r: calibration, EMA(observed accepted drafts) / EMA(m at the budget used): how far the drafter's
  confidence is from the target's agreement on this workload.
- 1 + ...: every round emits one token (the bonus) besides the accepted drafts.
- B = 0 (`NO_DRAFT`) is a candidate too: a round without a draft (the tree is the root alone, so it
  is the AR step plus handing the drafter the accepted token's features), rate 1 / cost(S, 0). It
  wins where no tree pays for its draft and verify, e.g. large batches of a large target, where even
  budget 4 costs twice the AR step, and is chosen when its rate beats the best tree's by
  `NO_DRAFT_MARGIN`. A round at 0 drafts nothing, so it says nothing about acceptance:
  it is weighed only after `NO_DRAFT_AFTER` drafted slot-rounds (in `NO_DRAFT_AFTER_ROUNDS` rounds at
  least), and after `EXPLORE_EVERY` x cost(S, B) / cost(S, 0) rounds at 0 in a row (at least
  `EXPLORE_EVERY`) the chooser drafts one round at the best budget B, which refreshes m and r: that round's
  extra cost then stays about 1/EXPLORE_EVERY of the time. Each exploring round that leaves NO_DRAFT the
  winner doubles that spacing, up to `EXPLORE_BACKOFF` times (a workload where no tree pays spends ~1/32 of
  its time exploring, not 1/8); a drafted round chosen on its rate resets it. With overlapped rounds the
  choice after an exploring round comes before that round is observed, so the spacing doubles there anyway,
  and the next choice, which has seen it, resets it if drafting pays.
  A round at 0 grafts no prompt lookup either: it is plain decoding's step, as weighed (with lookup's
  rows it cost 2.6x the AR step at 8 slots on a 2-core CPU, and auto ran there at 0.57x plain decoding's
  tokens/s). cost(S, 0) is measured with the others.
- On a GPU cost(S, B) is a replay's time, which leaves out the host's work between rounds (the same at every
  budget), so small trees look cheaper per second than they are; r, one number for every budget, is what
  tilts the rule back (with prompt lookup on, lookup's tokens count in it). Correcting r alone made auto
  slower (benchmarks/lookup-chooser-apart/, benchmarks/lookup-chooser-seen/); adding the host's measured time
  per round to every budget's cost changed tokens/s by -0.4% to +1.5% (benchmarks/gpu-chooser-overhead/), so
  the costs stay replay times.
- Eager rounds (the CPU) also refine cost(S, B) with the time of every round that ran at B (EMA): the
  first measurement is one round on a machine whose speed drifts, and such noise alone once decided
  between drafting and not.

Before the first round has been observed the chooser uses `initial` (64, or the largest candidate when all
are smaller: 16 on the CPU). Ties go to the smaller
budget. No synchronisation happens here: `observe` takes plain Python numbers.

Not every budget is a candidate at every batch size: `max_budget(S)` bounds them (the engine's
`auto_budget_limit`: a round verifies S x (B + 1) tokens, at most `MAX_AUTO_ROUND_TOKENS`, and its
vocabulary-wide sampling tensors must fit in half the device memory free when the bucket is first
weighed). Past a few hundred tokens a round's forward is compute-bound on any GPU, so its cost grows
with the tree while the tree's gain flattens; and measuring budget 512 at batch 32 ran an H200 out of memory
(benchmarks/h200-serve). Budgets above the bound are neither measured nor chosen.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

# 4 and 8 are for large batches: at batch 32 a budget-16 round already verifies 32 x 17 tokens, past the
# point where the target's forward stops being weight-bound, so the smallest trees are the ones that can
# stay near the AR step there.
AUTO_BUDGETS = (4, 8, 16, 32, 64, 128, 256, 512)
NO_DRAFT = 0  # the budget of a round without a draft (plain decoding's step)
EXPLORE_EVERY = 8  # rounds at NO_DRAFT in a row (times the cost ratio) before one drafted round measures acceptance again
# Drafted slot-rounds (a round of S running slots counts S), in at least NO_DRAFT_AFTER_ROUNDS rounds, observed
# before NO_DRAFT is weighed: one unlucky first round must not stop drafting (at NO_DRAFT only the exploring
# rounds teach the averages anything, so they would recover slowly). Counted in slot-rounds since a round of
# 8 slots averages 8 requests' acceptance: waiting for 8 such rounds, each 3-5x the AR step on a 2-core CPU, took
# ~3 s of a 30 s run at 8 slots where no tree paid.
NO_DRAFT_AFTER = 8
NO_DRAFT_AFTER_ROUNDS = 2
# Each exploring round after which NO_DRAFT still wins doubles the spacing of the next, up to this factor;
# a round the rule drafts on its rate resets it. (Not the batch bucket changing: it follows the highest
# running slot, which at 2-4 requests flips with every request that ends, so it would keep the spacing at 1.)
EXPLORE_BACKOFF = 4
# NO_DRAFT must beat the best tree's expected rate by this factor: acceptance comes in stretches, and
# at NO_DRAFT the averages learn only from the exploring rounds, so a close call would stick.
NO_DRAFT_MARGIN = 1.15
# Tokens a round may verify (batch bucket x (budget + 1)) for a budget to be a candidate of the auto budget.
MAX_AUTO_ROUND_TOKENS = 4096
# Bytes of vocabulary-wide working tensors per verified token and vocabulary entry, at most: the logits and,
# sampling with top-p on CUDA, float32 scores and probabilities, the sort's values and int64 indices, float64
# cumulative masses and the masks (~50 bytes; a round at batch 32 x 513 tokens of SmolLM2's 49,152-token
# vocabulary held 49 GiB in its CUDA graph's pool). The auto budget's candidates keep these within
# AUTO_MEMORY_FRACTION of the device memory free when their batch bucket is first weighed: a capture holds
# them twice at its peak (its warm-up's blocks, cached for the warm-up's stream, and the graph's pool).
ROUND_BYTES_PER_LOGIT = 64
AUTO_MEMORY_FRACTION = 0.5


def auto_budget_limit(bucket: int, vocab_size: int, free_bytes: int | None) -> int:
    """The largest tree budget the auto budget weighs at batch bucket `bucket`: its round verifies at most
    MAX_AUTO_ROUND_TOKENS tokens and, where `free_bytes` is known (CUDA), its vocabulary-wide tensors take at
    most AUTO_MEMORY_FRACTION of them."""
    tokens = MAX_AUTO_ROUND_TOKENS
    if free_bytes is not None:
        tokens = min(tokens, int(free_bytes * AUTO_MEMORY_FRACTION) // (vocab_size * ROUND_BYTES_PER_LOGIT))
    return tokens // bucket - 1


def expected_drafts(tree, budgets: torch.Tensor) -> torch.Tensor:
    """m(B) of each slot's tree for every B (see the module docstring).

    budgets: [C] int64 on the tree's device (made once, outside any CUDA graph: a tensor built from
    a Python list inside a captured round would be a host-to-device copy) -> [S, C] float32.
    """
    ranked = tree.ranked_scores
    if ranked is None:
        return torch.zeros(tree.tokens.shape[0], budgets.shape[0], device=tree.tokens.device)
    mass = ranked.float().exp().cumsum(-1)  # exp(-inf) = 0: invalid candidates add nothing
    return mass[:, (budgets - 1).clamp_max(ranked.shape[1] - 1)]


def best_budget(costs: dict[int, float], drafts: dict[int, float]) -> int:
    """argmax_B (1 + drafts[B]) / costs[B]; the smallest budget among ties (within 1e-9)."""
    rates = {b: (1.0 + drafts[b]) / costs[b] for b in sorted(costs)}
    top = max(rates.values())
    return min(b for b, rate in rates.items() if rate >= top * (1 - 1e-9))


@dataclass
class CostProfile:
    """Seconds per round by batch bucket and budget, on one device for one model pair."""

    device: str
    seconds: dict[int, dict[int, float]] = field(default_factory=dict)

    def cost(self, bucket: int, budget: int) -> float:
        if budget == NO_DRAFT:
            return self.seconds[bucket][NO_DRAFT]
        # Trees are interpolated among trees: a round without a draft skips the drafter, a step apart.
        points = sorted((b, c) for b, c in self.seconds[bucket].items() if b != NO_DRAFT)
        if len(points) == 1:
            return points[0][1]
        for (b0, c0), (b1, c1) in zip(points, points[1:]):
            if budget <= b1 or (b1, c1) == points[-1]:
                # Linear between the two measured budgets around it (or beyond the last two).
                return max(c0 + (c1 - c0) * (budget - b0) / (b1 - b0), 1e-9)
        raise AssertionError("unreachable")

    def save(self, path: str | Path) -> None:
        """Write the profile to `path` (its folder made if missing), whole or not at all: written beside it,
        then renamed over it, so a reader (another engine on the same machine) never sees half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        part.write_text(json.dumps({"device": self.device, "seconds": {
            str(s): {str(b): c for b, c in costs.items()} for s, costs in self.seconds.items()}}, indent=1))
        os.replace(part, path)

    @staticmethod
    def load(path: str | Path) -> "CostProfile":
        data = json.loads(Path(path).read_text())
        return CostProfile(data["device"], {int(s): {int(b): float(c) for b, c in costs.items()}
                                            for s, costs in data["seconds"].items()})


def _log(message: str) -> None:
    print(f"treeflash: {message}", file=sys.stderr, flush=True)


class BudgetChooser:
    """Chooses each round's budget (see the module docstring) and learns from the rounds it sees.

    measure(bucket, budget) -> seconds per round; called for `probes` the first time a bucket runs
    without a stored profile. budgets: the tree budgets weighed (all must appear in AUTO_BUDGETS'
    order, as the round's `predicted` columns do). no_draft: weigh NO_DRAFT too (its cost is
    measured with the probes, or on its own for a stored profile that lacks it). max_budget(bucket):
    the largest tree budget measured or chosen at that bucket (None: every budget); the smallest
    budget stays a candidate whatever it says.
    """

    def __init__(self, measure: Callable[[int, int], float] | None, profile: CostProfile | None = None,
                 budgets: tuple[int, ...] = AUTO_BUDGETS, probes: tuple[int, ...] | None = None,
                 initial: int = 64, decay: float = 0.9, log: Callable[[str], None] | None = _log,
                 no_draft: bool = True, measure_by_running: bool = False,
                 max_budget: Callable[[int], int] | None = None):
        self.measure, self.budgets, self.decay, self.log = measure, budgets, decay, log
        self.max_budget = max_budget
        self.initial = min(initial, max(budgets))  # the first round's budget (no acceptance seen yet): a candidate
        self.no_draft = no_draft
        # Eager rounds (the CPU) time themselves (`refine`): there the first real round at each probe is its
        # measurement, largest budget first, no draft last, instead of rounds that only measure (which
        # delayed a request's first token by ~1.3 s on a 2-core CPU).
        self.measure_by_running = measure_by_running
        if measure_by_running:
            self.probes = tuple(sorted(probes or budgets, reverse=True)) + ((NO_DRAFT,) if no_draft else ())
        else:
            self.probes = ((NO_DRAFT,) if no_draft and measure is not None else ()) + tuple(probes or budgets)
        self.undrafted = 0  # rounds at NO_DRAFT in a row
        self.drafted = 0  # drafted rounds observed
        self.drafted_slots = 0  # drafted slot-rounds observed (a round of S running slots counts S)
        self.backoff = 1  # the exploring rounds' spacing factor (1 .. EXPLORE_BACKOFF)
        self._explored = False  # the last round chosen was an exploring one
        self.profile = profile or CostProfile(device="")
        self.curve: list[float] | None = None  # EMA of m(B) per candidate
        self.observed = 0.0  # EMA of accepted drafts per slot-round
        self.predicted = 0.0  # EMA of m(budget used) per slot-round
        # costs() of the last bucket asked, and the measurements it came from: on a GPU these stay fixed
        # after the first round, and interpolating every budget anew took ~35 us of host time per round
        # (this CPU), between the round's sync and the next replay.
        self._costs: tuple[tuple, dict[int, float]] | None = None

    def allowed(self, bucket: int) -> tuple[int, ...]:
        """The tree budgets weighed at this bucket: those within max_budget(bucket), the smallest always."""
        if self.max_budget is None:
            return self.budgets
        top = self.max_budget(bucket)
        return tuple(b for b in self.budgets if b <= top) or self.budgets[:1]

    def _probes(self, bucket: int) -> tuple[int, ...]:
        top = max(self.allowed(bucket))
        return tuple(b for b in self.probes if b <= top)  # (NO_DRAFT, 0, always)

    @property
    def calibration(self) -> float:
        return self.observed / self.predicted if self.predicted > 1e-6 else 1.0

    def costs(self, bucket: int) -> dict[int, float]:
        if bucket not in self.profile.seconds:
            if self.measure is None:
                raise ValueError(f"no cost profile for batch bucket {bucket} and nothing to measure it with")
            probes = self._probes(bucket)
            if self.log:
                self.log(f"measuring round cost at tree budgets {list(probes)} for batch size <= {bucket}")
            self.profile.seconds[bucket] = {b: self.measure(bucket, b) for b in probes}
        measured = self.profile.seconds[bucket]
        if self.no_draft and NO_DRAFT not in measured and self.measure is not None:
            measured[NO_DRAFT] = self.measure(bucket, NO_DRAFT)  # (a stored profile from before NO_DRAFT)
        key = (bucket, tuple(measured.items()))  # (eager rounds refine the measurements every round)
        if self._costs is None or self._costs[0] != key:
            costs = {b: self.profile.cost(bucket, b) for b in self.allowed(bucket)}
            if self.no_draft and NO_DRAFT in measured:  # never extrapolated: measured or not weighed
                costs[NO_DRAFT] = self.profile.cost(bucket, NO_DRAFT)
            self._costs = (key, costs)
        return self._costs[1]

    def choose(self, bucket: int) -> int:
        if self.measure_by_running:
            measured = self.profile.seconds.setdefault(bucket, {})
            unmeasured = [b for b in self._probes(bucket) if b not in measured]
            if unmeasured:
                return unmeasured[0]
        costs = self.costs(bucket)
        allowed = self.allowed(bucket)
        if self.curve is None:
            return min(self.initial, max(allowed))
        r = self.calibration
        drafts = {b: r * m for b, m in zip(self.budgets, self.curve)}
        trees = {b: costs[b] for b in allowed}
        budget = best_budget(trees, drafts)
        explored, self._explored = self._explored, False
        if NO_DRAFT not in costs or self.drafted < NO_DRAFT_AFTER_ROUNDS or self.drafted_slots < NO_DRAFT_AFTER:
            return budget
        if (1.0 + drafts[budget]) / costs[budget] * NO_DRAFT_MARGIN >= 1.0 / costs[NO_DRAFT]:
            self.undrafted, self.backoff = 0, 1
            return budget
        if explored:  # it drafted, and NO_DRAFT still wins: look again later
            self.backoff = min(2 * self.backoff, EXPLORE_BACKOFF)
        self.undrafted += 1
        # One drafted round keeps m and r current. It costs cost(B) - cost(0) more than the round it replaces:
        # spaced by the cost ratio, exploring takes at most about 1/EXPLORE_EVERY of the time (on a 2-core CPU
        # at 8 slots a tree round cost ~4x the AR step, and one in nine cost a quarter of the time), and
        # 1/(EXPLORE_EVERY x EXPLORE_BACKOFF) once the exploring rounds keep confirming NO_DRAFT.
        if self.undrafted > EXPLORE_EVERY * self.backoff * max(1.0, costs[budget] / costs[NO_DRAFT]):
            self.undrafted, self._explored = 0, True
            return budget
        return NO_DRAFT

    def refine(self, bucket: int, budget: int, seconds: float) -> None:
        """Fold a round's measured time into cost(bucket, budget) (EMA); with `measure_by_running`, a
        probe's first round sets it. For eager rounds (the CPU), whose first measurement is one noisy
        round: the engine's own clock of a round is the same kind of time there. (Graph replays are
        measured precisely by CUDA events, and the engine's clock would add its host work to the
        budgets that run only.)"""
        measured = self.profile.seconds.get(bucket)
        if measured is not None and budget in measured:
            measured[budget] = self.decay * measured[budget] + (1 - self.decay) * seconds
        elif measured is not None and self.measure_by_running and budget in self.probes:
            measured[budget] = seconds  # its first round: the measurement

    def observe(self, budget: int, accepted: list[int], predicted: list[list[float]]) -> None:
        """One round: accepted (tokens emitted, drafts + 1) and predicted m(B) rows of the running slots.
        A round without a draft (NO_DRAFT) predicted nothing and teaches nothing."""
        if not accepted or budget == NO_DRAFT:
            return
        self.drafted += 1
        n = len(accepted)
        self.drafted_slots += n
        column = self.budgets.index(budget)
        drafts = sum(a - 1 for a in accepted) / n
        at_budget = sum(row[column] for row in predicted) / n
        mean_curve = [sum(row[i] for row in predicted) / n for i in range(len(self.budgets))]
        if self.curve is None:
            self.curve, self.observed, self.predicted = mean_curve, drafts, at_budget
            return
        d = self.decay
        self.curve = [d * c + (1 - d) * m for c, m in zip(self.curve, mean_curve)]
        self.observed = d * self.observed + (1 - d) * drafts
        self.predicted = d * self.predicted + (1 - d) * at_budget

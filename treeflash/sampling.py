"""Sampling parameters, the processed distribution, and the per-node draw ("derive").

`processed_probs` is the only function that turns logits into the distribution a request samples
from; plain decoding and tree verification both call it, which is half of why sampling is lossless.

Randomness is counter-based: the uniform behind a drawn token is a hash of (request seed, position of
that token in the sequence). No generator state, no host synchronisation, nothing CUDA graphs cannot
replay, and nothing that depends on the batch. Why keying by position is exact: every tree node at
depth d draws the token at position start + d + 1, so nodes of one depth share a uniform, but the walk
visits one node per depth and the uniforms of depths it does not reach are never observed; the
emitted token at each position is F^-1(u_pos) under that position's true conditional, exactly what
plain sampling with the same seed emits. A seeded request therefore gives the same tokens with or
without a drafter (up to float rounding of the logits at a CDF boundary), whatever its batch.

The draw itself is exact to double precision: a 52-bit uniform on an odd 2^-53 grid (exactly uniform
over seeds: `draw_uniforms`) against a float64 cumulative sum (`inverse_cdf`), so a token's chance
differs from its processed probability by about 1e-16, and the total variation at a 150k vocabulary
is about 1e-10 (tests/test_sampler_exact.py).
"""

from __future__ import annotations

import math
import numbers
import operator
import dataclasses
import random
from dataclasses import dataclass

import torch

from treeflash.logprobs import check_logprobs
from treeflash.structured import StructuredOutputsParams
from treeflash.transfer import to_device

GREEDY_BELOW = 1e-5  # temperatures below this decode greedily


@dataclass
class SamplingParams:
    """How to sample one request (vLLM conventions). temperature=0 (or below 1e-5) means greedy.

    First, on the logits: logit_bias ({token id: bias in [-100, 100]}, OpenAI's) is added; then vLLM's penalties
    (treeflash/penalties.py): repetition_penalty (> 0; 1 = off)
    divides positive logits of tokens in the prompt or the output by it and multiplies the others;
    frequency_penalty (in [-2, 2]) subtracts it times the token's count in the output; presence_penalty (in
    [-2, 2]) subtracts it from tokens in the output; and while fewer than min_tokens tokens are generated,
    the request's stop tokens (its stop_token_ids, and EOS unless ignore_eos) get no probability. They apply
    to greedy requests too.

    The filters follow vLLM's v1 sampler, in its order:
    1. temperature: logits / temperature.
    2. min_p: drop tokens whose probability is below min_p times the top token's.
    3. top_k: keep the tokens whose logit is at least the k-th largest (-1 = off); tokens tied with
       the k-th are all kept, so a tie can keep more than k (as in vLLM's reference implementation
       and Hugging Face's warper).
    4. top_p: on the distribution renormalised over what min_p and top_k kept, keep the smallest set
       of most likely tokens whose mass reaches top_p (every token whose more likely tokens hold
       less than top_p). Ties are broken by token id, larger id first, as a stable ascending sort
       breaks them: [.4 .2 .2 .2] at top_p=.5 keeps ids 0 and 3. (vLLM and Hugging Face sort
       ascending without asking for stability, so which tied tokens they keep is their kernel's choice;
       how many is the same.)
    The result is renormalised. min_p and top_k commute; top_p sees their renormalised remainder.
    """

    # Completions of each prompt (vLLM's): n requests, choice j seeded seed + j where a seed is given;
    # RequestOutput.outputs holds them
    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 16
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    # True: a stop string that ends the request is kept at the end of its text (vLLM's; by default it is cut)
    include_stop_str_in_output: bool = False
    # False: no text is made (RequestOutput.text is ""); token ids only, which saves a host-side
    # decode per token when many requests run (training data). Stop strings need the text.
    detokenize: bool = True
    # False: special tokens (EOS, chat markers) are written into the text too (vLLM's; by default they are left out)
    skip_special_tokens: bool = True
    # None: no log-probs; n: each generated token's log-prob and rank under the target's raw distribution,
    # with the n most likely tokens' (0 <= n <= 20; treeflash/logprobs.py).
    logprobs: int | None = None
    # None: none; n: each prompt token's log-prob (but the first's) under the target, with the n most likely
    # tokens' (vLLM's prompt_logprobs). A request asking for them is prefilled eagerly (no prefill graph).
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    # Only these tokens can be generated (vLLM's): every other token's logit is -inf before the bias and penalties
    allowed_token_ids: list[int] | None = None
    # Words never to generate (vLLM's): each tokenised alone and word-initially (treeflash/bad_words.py); a word's
    # last token gets no probability right after the rest of it (in the output, not the prompt)
    bad_words: list[str] | None = None
    # No stop token can be drawn, and no stop string ends the request, before this many tokens (vLLM's)
    min_tokens: int = 0
    # Keep only the prompt's last k tokens (vLLM's left truncation); -1: as many as the context holds with one
    # token left to generate (`truncate_prompt`)
    truncate_prompt_tokens: int | None = None
    # What the reply must be: a JSON schema, a regular expression or one of some strings (vLLM's;
    # treeflash/structured.py): every token outside the structure's next ones gets no probability
    structured_outputs: StructuredOutputsParams | dict | None = None

    def __post_init__(self) -> None:
        # numpy and torch scalars are taken (as Python numbers), bools are not.
        def number(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            setattr(self, name, float(value) if type(value) not in (int, float) else value)
            return float(value)

        def integer(name: str) -> int:
            value = as_int(getattr(self, name))
            if value is None:
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
            setattr(self, name, value)
            return value

        if number("temperature") < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < number("top_p") <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if integer("top_k") < -1:
            raise ValueError(f"top_k must be -1 or 0 (off, as in vLLM) or at least 1, got {self.top_k}")
        if self.top_k == 0:
            self.top_k = -1
        if not 0 <= number("min_p") <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if integer("n") < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if integer("max_tokens") < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.seed is not None and not 0 <= integer("seed") < 1 << 64:
            raise ValueError(f"seed must be in [0, 2**64) (64 bits; larger or negative seeds would alias), "
                             f"got {self.seed}")
        if self.seed is not None and self.seed + self.n > 1 << 64:
            raise ValueError(f"with n = {self.n}, seed must be at most 2**64 - n = {(1 << 64) - self.n} (completion j "
                             f"gets seed + j), got {self.seed}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None:
            if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) for s in self.stop):
                raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
            if any(s == "" for s in self.stop):
                raise ValueError("stop strings must not be empty")
            self.stop = list(self.stop)
        if self.stop_token_ids is not None:
            ids = self.stop_token_ids
            as_ints = [as_int(i) for i in ids] if isinstance(ids, (list, tuple)) else [None]
            if any(i is None or i < 0 for i in as_ints):
                raise ValueError(f"stop_token_ids must be a list of non-negative token ids, got {ids!r}")
            self.stop_token_ids = as_ints
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if not isinstance(self.include_stop_str_in_output, bool):
            raise ValueError(f"include_stop_str_in_output must be a bool, got {self.include_stop_str_in_output!r}")
        if not isinstance(self.detokenize, bool):
            raise ValueError(f"detokenize must be a bool, got {self.detokenize!r}")
        if not isinstance(self.skip_special_tokens, bool):
            raise ValueError(f"skip_special_tokens must be a bool, got {self.skip_special_tokens!r}")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True (they are matched in the text)")
        self.logprobs = check_logprobs(self.logprobs)
        self.prompt_logprobs = check_logprobs(self.prompt_logprobs, "prompt_logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= number(name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < number("repetition_penalty") <= 1e4:
            raise ValueError(f"repetition_penalty must be in (0, 1e4] (1 = off), got {self.repetition_penalty}")
        if not 0 <= integer("min_tokens") <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens = {self.max_tokens}], got {self.min_tokens}")
        if self.logit_bias is not None:
            bias = self.logit_bias
            ids = {as_int(k) for k in bias} if isinstance(bias, dict) else {None}
            values = list(bias.values()) if isinstance(bias, dict) else []
            if None in ids or min(ids, default=0) < 0 or any(
                    isinstance(v, bool) or not isinstance(v, numbers.Real) or not -100 <= v <= 100 for v in values):
                raise ValueError(f"logit_bias must map token ids to biases in [-100, 100], got {bias!r}")
            self.logit_bias = {as_int(k): float(v) for k, v in bias.items()} or None
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            as_ints = [as_int(i) for i in ids] if isinstance(ids, (list, tuple)) else [None]
            if not as_ints or any(i is None or i < 0 for i in as_ints):
                raise ValueError(f"allowed_token_ids must be a non-empty list of token ids, got {ids!r}")
            self.allowed_token_ids = sorted(set(as_ints))
        if self.truncate_prompt_tokens is not None and not (integer("truncate_prompt_tokens") == -1
                                                            or self.truncate_prompt_tokens >= 1):
            raise ValueError(f"truncate_prompt_tokens must be None, -1 (as many as leave a token to generate) or at "
                             f"least 1, got {self.truncate_prompt_tokens}")
        if self.bad_words is not None:
            words = self.bad_words
            if isinstance(words, str) or not isinstance(words, (list, tuple)) or not all(
                    isinstance(w, str) and w for w in words):
                raise ValueError(f"bad_words must be a list of non-empty strings, got {words!r}")
            self.bad_words = list(words) or None
        if isinstance(self.structured_outputs, dict):
            unknown = sorted(set(self.structured_outputs) - {"json", "regex", "choice", "json_object",
                                                             "whitespace_pattern"})
            if unknown:
                raise ValueError(f"structured_outputs has unknown fields {unknown} (json, regex, choice, json_object, "
                                 f"whitespace_pattern)")
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                raise ValueError(f"structured_outputs must be a StructuredOutputsParams or a dict of its fields, got "
                                 f"{self.structured_outputs!r}")
            # Each of these masks tokens too: with a structure the two could leave a state no token at all.
            clash = [name for name, on in (("allowed_token_ids", self.allowed_token_ids is not None),
                                           ("bad_words", bool(self.bad_words)), ("min_tokens", self.min_tokens > 0))
                     if on]
            if clash:
                raise ValueError(f"structured_outputs cannot be combined with {', '.join(clash)}")

    @property
    def masked(self) -> bool:
        """A logit_bias or allowed_token_ids: a dense row added to the slot's logits."""
        return bool(self.logit_bias) or self.allowed_token_ids is not None

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflow float32; such requests are greedy (as in vLLM).
        return self.temperature < GREEDY_BELOW


def truncate_prompt(ids: list[int], k: int | None, max_model_len: int) -> list[int]:
    """The prompt as truncate_prompt_tokens=k keeps it: its last k tokens (-1: max_model_len - 1, the most that
    leaves a token to generate, where vLLM's -1 leaves none; None: all)."""
    if k is None:
        return ids
    return ids[-(max_model_len - 1 if k == -1 else k):]


def as_int(value) -> int | None:
    """A Python int for an integer (numpy's and torch's included), None for anything else (bools and floats);
    what SamplingParams and prompt_token_ids take as an integer."""
    if isinstance(value, (bool, float)) or not hasattr(type(value), "__index__"):
        return None
    try:
        return operator.index(value)
    except TypeError:  # e.g. a torch tensor of more than one element, or of floats
        return None


@dataclass(frozen=True)
class SamplingFlags:
    """Which sampling stages a batch needs: host-known (plain Python over the parameters, no tensors), so
    the stages it leaves out cost nothing and no round waits on the device; part of a CUDA graph's key."""

    all_greedy: bool = True
    use_top_k: bool = False
    use_top_p: bool = False
    use_min_p: bool = False
    max_top_k: int = 0  # a power of two >= every row's top_k (0: no row uses top-k)
    logprobs: bool = False  # some request asks for log-probs: rounds pack them into the read-back
    use_penalties: bool = False  # some request has a penalty: rounds count tokens and penalise the logits
    use_logit_bias: bool = False  # some request has a logit_bias or allowed_token_ids: rounds add the slots' bias rows
    use_min_tokens: bool = False  # some request has min_tokens: rounds suppress stop tokens drawn too early
    use_bad_words: bool = False  # some request has bad_words: rounds mask each node's banned tokens
    use_structure: bool = False  # some request has structured_outputs: rounds mask each node by its state

    @staticmethod
    def of(params: list[SamplingParams]) -> "SamplingFlags":
        top_k = max((max(p.top_k, 0) for p in params), default=0)
        # Any top-k width >= the largest asked for gives the same result: rounded up to a power of two,
        # requests with nearby k share one graph.
        return SamplingFlags(all_greedy=all(p.greedy for p in params), use_top_k=top_k > 0,
                             use_top_p=any(p.top_p < 1 and not p.greedy for p in params),
                             use_min_p=any(p.min_p > 0 and not p.greedy for p in params),
                             max_top_k=1 << (top_k - 1).bit_length() if top_k > 0 else 0,
                             logprobs=any(p.logprobs is not None for p in params),
                             use_penalties=any(p.penalized for p in params),
                             use_logit_bias=any(p.masked for p in params),
                             use_min_tokens=any(p.min_tokens > 0 for p in params),
                             use_bad_words=any(p.bad_words for p in params),
                             use_structure=any(p.structured_outputs is not None for p in params))


@dataclass(frozen=True)
class SamplingTensors:
    """The sampling parameters of a batch of slots as device tensors, one row per slot."""

    temperature: torch.Tensor  # [S] float32, 1.0 on greedy rows (their processed probs are unused)
    top_k: torch.Tensor  # [S] int64, 0 = off
    top_p: torch.Tensor  # [S] float64 (the cumulative masses it is compared with are float64)
    min_p: torch.Tensor  # [S] float32
    greedy: torch.Tensor  # [S] bool
    seed: torch.Tensor  # [S, 2] int64: low and high 32 bits
    repetition: torch.Tensor  # [S] float32, 1 = off (treeflash/penalties.py)
    frequency: torch.Tensor  # [S] float32
    presence: torch.Tensor  # [S] float32
    flags: SamplingFlags = SamplingFlags()  # which stages any row needs (static per batch)

    @staticmethod
    def build(params: list[SamplingParams], seeds: list[int], device) -> "SamplingTensors":
        def tensor(values, dtype):
            return to_device(values, device, dtype)

        # 0 = off per row; a k of 2^31 or more keeps every token of any vocabulary, and as int64 one of 2^63
        # or more would not even convert (the whole batch's prefill failed on it).
        top_k = [p.top_k if 0 < p.top_k < 1 << 31 else 0 for p in params]
        return SamplingTensors(
            temperature=tensor([1.0 if p.greedy else p.temperature for p in params], torch.float32),
            top_k=tensor(top_k, torch.int64),
            top_p=tensor([p.top_p for p in params], torch.float64),
            min_p=tensor([p.min_p for p in params], torch.float32),
            greedy=tensor([p.greedy for p in params], torch.bool),
            seed=tensor([[s & 0xFFFFFFFF, (s >> 32) & 0xFFFFFFFF] for s in seeds], torch.int64),
            repetition=tensor([p.repetition_penalty for p in params], torch.float32),
            frequency=tensor([p.frequency_penalty for p in params], torch.float32),
            presence=tensor([p.presence_penalty for p in params], torch.float32),
            flags=SamplingFlags.of(params),
        )

    def per_node(self, nodes: int) -> "SamplingTensors":
        """Each slot's parameters repeated for its `nodes` tree nodes ([S, nodes]): views, no copy (in a
        CUDA graph a gather per field was a kernel each)."""
        def repeat(t):
            return t[:, None].expand(t.shape[0], nodes, *t.shape[1:])

        return SamplingTensors(*(repeat(t) for t in self._rows()), self.flags)

    def rows(self, index: torch.Tensor) -> "SamplingTensors":
        """The parameters of the slots in `index` (any shape): one row per node of a tree, say."""
        return SamplingTensors(*(t[index] for t in self._rows()), self.flags)

    def _rows(self) -> list[torch.Tensor]:
        return [getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "flags"]


def new_seed() -> int:
    """A seed for a request that gave none (64 bits from the OS)."""
    return random.SystemRandom().getrandbits(64)


def processed_probs(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """logits: [..., V] with st's tensors shaped [...] -> the processed distribution [..., V] (float32).

    The order and tie rules are SamplingParams' (vLLM's): temperature, min_p, top_k, top_p.
    """
    x = logits.float() / st.temperature[..., None]
    if st.flags.use_min_p:
        # p_i >= min_p * p_max  <=>  exp(x_i - x_max) >= min_p: no normalisation needed.
        ratio = (x - x.amax(-1, keepdim=True)).exp()
        x = x.masked_fill(ratio < st.min_p[..., None], -math.inf)
    if st.flags.use_top_k:
        kmax = min(st.flags.max_top_k, x.shape[-1])
        top = x.topk(kmax, dim=-1).values
        k = st.top_k.clamp(1, kmax)[..., None]
        kth = torch.where(st.top_k[..., None] > 0, top.gather(-1, k - 1), torch.full_like(top[..., :1], -math.inf))
        x = x.masked_fill(x < kth, -math.inf)
    probs = torch.softmax(x, dim=-1)
    if st.flags.use_top_p:
        probs = _top_p(probs, st.top_p)
    return probs


def _top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """probs [..., V], top_p [...] -> probs cut to the smallest most likely set reaching top_p, renormalised.

    A stable ascending sort ranks equal probabilities by token id, so among ties the larger id counts
    as more likely (a fixed rule where vLLM's and Hugging Face's unstable sorts leave it to the kernel).
    A token is kept when the tokens ranked above it
    hold less than top_p of the mass; the masses are summed in float64 so that a 150k-token
    vocabulary does not move the cut. Off CUDA only the candidates are sorted (`_top_p_candidates`).
    """
    # (CUDA sorts every row whole, a group of rows at a time: fixed shapes, for CUDA graphs)
    keep = _top_p_sorted(probs, top_p) if probs.is_cuda else _top_p_candidates(probs, top_p)
    probs = probs.masked_fill(~keep, 0.0)
    return probs / probs.sum(-1, keepdim=True)


# At most this many rows x vocabulary sorted at once by `_top_p_sorted`. Its temporaries (values, int64 order,
# float64 sums) take ~28 bytes an element: sorted at once, a 32-slot round over 4,096 tree nodes needed 6 GiB at
# SmolLM2's vocabulary and 19 GiB at Qwen3's, and the largest such round sets the size of the pool every CUDA graph
# shares. Fewer, larger sorts are faster per row (benchmarks/h200-graph-pool), so the bound is not smaller.
TOP_P_SORT_ELEMENTS = 1 << 26


def _top_p_sorted(probs: torch.Tensor, top_p: torch.Tensor, elements: int = TOP_P_SORT_ELEMENTS) -> torch.Tensor:
    """The keep mask of `_top_p`'s rule [..., V], by a stable sort of every whole row, in as few equal groups
    of rows as keep each group within `elements` (rows are independent: the same mask)."""
    vocab = probs.shape[-1]
    rows = probs.reshape(-1, vocab)
    top_p = top_p.expand(probs.shape[:-1]).reshape(-1, 1)
    keep = torch.empty(rows.shape, dtype=torch.bool, device=probs.device)
    n = rows.shape[0]
    groups = max(1, -(-n * vocab // elements))
    step = max(1, -(-n // groups))
    for start in range(0, n, step):
        part = slice(start, start + step)
        ascending, order = rows[part].sort(dim=-1, stable=True)
        below = ascending.cumsum(-1, dtype=torch.float64)  # mass of this token and all ranked below it
        total = below[:, -1:].clone()
        above = torch.sub(total, below, out=below)  # in place: one float64 buffer fewer
        # top_p = 1 keeps everything (a token under 1e-16 of the mass can vanish in the subtraction).
        keep_sorted = (above < top_p[part] * total) | (top_p[part] >= 1)
        keep[part].scatter_(-1, order, keep_sorted)
    return keep.view(probs.shape)


def _top_p_candidates(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The keep mask of `_top_p`'s rule [..., V], sorting per row only the tokens that can be in the nucleus.

    Tokens below (1 - top_p) * total / V hold less than (1 - top_p) of the mass all together, so the nucleus'
    smallest probability is at least that: only tokens at or above it can be kept, and the mass ranked above
    any of them is theirs alone. On a 2-core CPU the stable sort of every node's 49,152 probabilities was
    most of a sampled round's draw (benchmarks/cpu-top-p-candidates); a few hundred candidates sort at once.
    The sums are float64 as in the full sort, added in another order (a cut can move only where the mass
    above a token is within ~1e-16 of top_p * total). Row by row: the candidates' number varies.
    """
    vocab = probs.shape[-1]
    rows = probs.reshape(-1, vocab)
    ps = top_p.expand(probs.shape[:-1]).reshape(-1).tolist()
    keep = torch.zeros(rows.shape, dtype=torch.bool, device=probs.device)
    totals = rows.sum(-1, dtype=torch.float64).tolist()
    for r, (row, p, total) in enumerate(zip(rows, ps, totals)):
        if p >= 1:
            keep[r] = True
            continue
        candidates = torch.nonzero(row >= (1.0 - p) * total / vocab)[:, 0]  # ascending ids
        ascending, order = row[candidates].sort(stable=True)  # ties: the smaller id first, as in the full sort
        below = ascending.cumsum(0, dtype=torch.float64)
        above = below[-1] - below  # mass ranked above each candidate: the candidates after it in this order
        keep[r, candidates[order]] = above < p * total
    return keep.view(probs.shape)


# --- counter-based uniforms -------------------------------------------------------------------
_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2^32 for x in [0, 2^32), exact in int64: split c so no product overflows.
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    # MurmurHash3's finaliser: a bijection on 32 bits with full avalanche.
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


_ROUND_SALTS = (0x7F4A7C15, 0x2545F491, 0x3C6EF372, 0x1B873593)  # one per Feistel round


def draw_uniforms(seed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One uniform per draw: seed [S, 2], positions [S, N] of the tokens drawn -> [S, N] float64.

    u = (2k + 1) / 2^53 for k the top 52 bits of a 64-bit block: the seed's two 32-bit halves through
    a four-round Feistel network whose round keys hash the position. A Feistel network is a bijection
    of the block whatever its round function, so at every position a uniformly random 64-bit seed
    gives every k equally often: the draw is exactly uniform on the 52-bit grid. (Hashing the seed
    down to one 32-bit state first, as an earlier version did, reached only 2^32 of the 2^52 values.)
    Every value is exact in float64, strictly inside (0, 1), and the grid is symmetric (1 - u is on it
    too). On CUDA the same int64 arithmetic runs as one Triton kernel (treeflash/hash_uniforms.py), bit
    for bit.
    """
    if positions.is_cuda:
        from treeflash.hash_uniforms import hash_uniforms  # Triton: imported on CUDA only

        return hash_uniforms(seed, positions)
    left, right = _feistel(seed[:, :1], seed[:, 1:], _fmix32((positions & _MASK32) ^ 0x9E3779B9))
    k = (left << 20) | (right >> 12)
    return ((k << 1) | 1).double() * 2.0 ** -53


def _feistel(left: torch.Tensor, right: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Four rounds over the 64-bit block (left, right); invertible for any key (tests/test_sampling.py).
    for salt in _ROUND_SALTS:
        left, right = right, left ^ _fmix32(right ^ key ^ salt)
    return left, right


_BLOCK = 256  # tokens per block of the two-level search: ~600 blocks for a 150k vocabulary


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws exact to double precision: probs [R, V] (>= 0, any float dtype, need not sum
    to 1), u [R, M] float64 in (0, 1) -> token ids [R, M].

    Token i is returned for u * total in [C_{i-1}, C_i), with C the float64 cumulative sum of probs.
    Rather than a float64 cumsum over the whole vocabulary for every tree node (written, then
    searched), the search is two-level: float64 sums of blocks of `_BLOCK` tokens, a search over the
    block CDF, then a float64 cumsum of the chosen block only. Both levels are float64, so each token's
    interval is exact to ~1e-16. (On CUDA the block sums are one Triton kernel: PyTorch's
    `sum(dtype=torch.float64)` of float32 values would first make a float64 copy of them all.)

    A zero-probability token is never returned: its interval is empty, and a target at the very top
    (u * total rounding up to total) is clamped to the last non-zero token.
    """
    rows, vocab = probs.shape
    block = min(_BLOCK, vocab)
    block_cdf = _block_sums(probs, block).cumsum(-1)  # [R, blocks]
    target = u * block_cdf[:, -1:]  # [R, M]
    b = torch.searchsorted(block_cdf, target.contiguous(), right=True)
    # The block CDF reaches its total at the last block holding any mass: never go past it.
    b = torch.minimum(b, torch.searchsorted(block_cdf, block_cdf[:, -1:].contiguous()))
    offset = torch.where(b > 0, block_cdf.gather(-1, (b - 1).clamp_min(0)), 0.0)  # [R, M]
    cols = b[..., None] * block + torch.arange(block, device=probs.device)  # [R, M, block]
    chosen = probs.gather(-1, cols.clamp_max(vocab - 1).flatten(1)).view(cols.shape)
    chosen = torch.where(cols < vocab, chosen.double(), 0.0)  # the ragged last block's overhang is empty
    cdf = offset[..., None] + chosen.cumsum(-1)
    j = torch.searchsorted(cdf, target[..., None].contiguous(), right=True)
    # Never past the block's last token with mass.
    j = torch.minimum(j, torch.searchsorted(cdf, cdf[..., -1:].contiguous()))
    return b * block + j[..., 0]


def _block_sums(probs: torch.Tensor, block: int) -> torch.Tensor:
    """probs [R, V] -> float64 sums of consecutive `block`-token blocks [R, ceil(V / block)] (the last
    one ragged). On CUDA one Triton kernel reads the float32 values once (`block_sums.py`); PyTorch's
    sum(dtype=float64) would first copy them all to float64."""
    if probs.is_cuda and probs.dtype == torch.float32 and probs.stride(1) == 1 and block == _BLOCK:
        from treeflash.block_sums import block_sums  # Triton: imported on CUDA only

        return block_sums(probs, block)
    return _block_sums_torch(probs, block)


def _block_sums_torch(probs: torch.Tensor, block: int) -> torch.Tensor:
    rows, vocab = probs.shape
    full = vocab // block
    sums = probs[:, :full * block].reshape(rows, full, block).sum(-1, dtype=torch.float64)
    if full * block < vocab:  # the ragged last block
        sums = torch.cat([sums, probs[:, full * block:].sum(-1, keepdim=True, dtype=torch.float64)], -1)
    return sums


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One inverse-CDF draw per row: probs [..., V], u [...] float64 in (0, 1) -> token ids [...]."""
    vocab = probs.shape[-1]
    return inverse_cdf(probs.reshape(-1, vocab), u.reshape(-1, 1).double()).view(u.shape)


def vocab_max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., V] -> (float32 maxima, index of each row's first maximum) [...], as `x.float().max(-1)`: greedy's
    argmax of the target's logits and the DFlash chain's best drafts. On CUDA two Triton kernels that spread
    each row over many programs (treeflash/vocab_rows.py: torch's one reduction took ~24 us for a 65-node
    Qwen3 tree's rows on the H200); elsewhere torch's."""
    if x.is_cuda:
        from treeflash.vocab_rows import max_rows  # Triton: imported on CUDA only

        return max_rows(x)
    return x.float().max(dim=-1)


def derive(logits: torch.Tensor, st: SamplingTensors, positions: torch.Tensor) -> torch.Tensor:
    """One token per node from the target's logits: the only step where greedy and sampling differ.

    logits: [S, N, V] (row 0 = root), in the lm_head's dtype; st: per-slot params [S]; positions: [S, N]
    position in the sequence of the token each node draws (the node's own position + 1). Greedy slots
    take the argmax (of the logits as they are: a float32 copy has the same one); sampled slots draw at
    each node from that node's processed distribution (float32).
    """
    greedy_tokens = vocab_max(logits)[1]
    if st.flags.all_greedy:
        return greedy_tokens
    probs = processed_probs(logits, st.per_node(logits.shape[1]))
    sampled = sample_from(probs, draw_uniforms(st.seed, positions))
    return torch.where(st.greedy[:, None], greedy_tokens, sampled)

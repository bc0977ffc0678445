"""One speculative round over a batch of slots: draft, build tree, verify, derive, walk, commit.

Autoregressive decoding (no drafter: the tree is the root alone) and the DFlash chain (one child per
depth) are the same round with a different tree. Nothing in a round reads a device value on the
host; the engine synchronises once per round, after `commit`, to read the emitted tokens.

No shape in a round depends on a value that changes between rounds: attention spans the whole cache
capacity (treeflash/attention.py), and each slot's sampling parameters live in static device rows
written when a request is admitted. The same round can therefore be replayed as a CUDA graph
(treeflash/runner.py); on the CPU it simply runs, and may be told to attend over fewer rows
(`kv_rows`): the rows in use, in whole blocks of the CPU attention kernel (`attend_width`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass

import torch

from treeflash.attention import FLEX_BLOCK, FLEX_DECODE_TOKENS, SDPA_KV_BLOCK, SplitKVMask, check_backend, \
    default_backend, round_layout
from treeflash.bad_words import BadWords
from treeflash.budget import AUTO_BUDGETS, NO_DRAFT, expected_drafts
from treeflash.kv_cache import KVCache, append_layout
from treeflash.logprobs import emitted_logprobs, pack
from treeflash.lookup import compact as compact_lookup, graft_lookup, keep_slots
from treeflash.penalties import PenaltyCounts, StopSuppression, penalize
from treeflash.models.dflash import DFlashDrafter
from treeflash.models.kernels import COMPILED, EAGER, pin_triton_cache_dir, prepack_cpu, projection_weights, \
    use_fast_path
from treeflash.models.transformer import Transformer
from treeflash.sampling import SamplingFlags, SamplingParams, SamplingTensors, derive
from treeflash.structured import GrammarSlots
from treeflash.transfer import to_device
from treeflash.tree import DraftTree, Walk, ancestor_mask, build_chain, build_tree, root_only, walk

METHODS = ("none", "dflash", "ddtree")
STAGES = ("draft", "tree", "verify", "derive_walk", "commit")
PREFILL_CHUNK = 512  # prompt tokens per prefill forward
# Draft nodes per round at most. Each round verifies root + budget nodes in one target pass (with a
# budget x budget mask) and every slot's caches hold budget extra rows: the bound turns a mistyped
# budget into an error at construction instead of an out-of-memory crash or an hours-long round.
MAX_TREE_BUDGET = 4096
MAX_NGRAM_TOKENS = 64
# The expected drafts m(B) of the automatic budget travel in the round's integer read-back (`readback`)
# as fixed point: value * PREDICTED_SCALE, rounded.
PREDICTED_SCALE = 1 << 16


# The most candidates (depths x budget, padded to a power of two as the Triton builder sorts them) at
# which it measured faster than the torch ops on the H200 (benchmarks/h200-treekernel-256/): per build,
# 15 depths, 69 / 127 / 351 us against 511 / 529 / 581 at budgets 64 / 128 / 256 (15 x 256 = 3840 -> 4096);
# SmolLM2-shape rounds at batch 1 0.77x / 0.81x / 0.90x the torch ops' time, Qwen3-8B 0.95x / 0.96x / 0.99x.
# Budget 512 (8192 candidates) was not measured: its builds did not finish within the call's time limit.
TREE_KERNEL_MAX_CANDIDATES = 4096
# The tree_kernel settings by name (bench --tree-builder; synthetic variants /treekernel, /treeops).
TREE_BUILDERS = {"auto": None, "kernel": True, "ops": False}


def use_path_kernels(setting: bool | None, device: torch.device) -> bool:
    """Whether a round walks its tree and makes its verify mask with the Triton kernels
    (treeflash/walk_kernel.py: one launch each) rather than `walk` / `ancestor_mask`'s torch ops. On CUDA
    unless `setting` (the tree builder's, `use_tree_kernel`) is False; never off CUDA (Triton)."""
    return device.type == "cuda" and setting is not False


def use_tree_kernel(setting: bool | None, device: torch.device, depths: int, budget: int) -> bool:
    """Whether a round builds DDTree's tree with the Triton kernel (treeflash/tree_kernel.py) rather than
    `build_tree`'s torch ops. setting: True/False force it on CUDA; None picks it for trees small enough
    to be faster. Never off CUDA (Triton). depths and budget are host ints: deciding costs no sync."""
    if device.type != "cuda":
        return False
    if setting is not None:
        return setting
    return 1 << (depths * budget - 1).bit_length() <= TREE_KERNEL_MAX_CANDIDATES


@dataclass(frozen=True)
class SpecConfig:
    method: str = "none"  # "none" (autoregressive), "dflash" (chain) or "ddtree" (tree)
    tree_budget: int | str = 64  # draft nodes per round (ddtree only), or "auto" (treeflash/budget.py)
    # Tokens of prompt lookup grafted onto every round's tree (treeflash/lookup.py), any method; 0: none.
    ngram_tokens: int = 0
    # Whether sampled requests' rounds verify lookup's rows too (greedy ones always do). None: not on the CPU, where
    # each verified row costs an eager round its share and sampled text repeats its context too little to repay
    # it (benchmarks/cpu-lookup-greedy/); yes on CUDA, where a round's rows are fixed and lookup's cost ~1%.
    ngram_sampled: bool | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"spec must be one of {METHODS}, got {self.method!r}")
        if isinstance(self.ngram_tokens, bool) or not isinstance(self.ngram_tokens, int) \
                or not 0 <= self.ngram_tokens <= MAX_NGRAM_TOKENS:
            raise ValueError(f"ngram_tokens must be an integer in [0, {MAX_NGRAM_TOKENS}] (0: no prompt lookup), "
                             f"got {self.ngram_tokens!r}")
        if self.ngram_sampled not in (None, True, False):
            raise ValueError(f"ngram_sampled must be True, False or None, got {self.ngram_sampled!r}")
        if self.tree_budget != "auto" and (isinstance(self.tree_budget, bool) or not isinstance(self.tree_budget, int)
                                           or self.tree_budget < 1):
            raise ValueError(f"tree_budget must be a positive integer or 'auto', got {self.tree_budget!r}")
        if self.tree_budget != "auto" and self.tree_budget > MAX_TREE_BUDGET:
            raise ValueError(f"tree_budget must be at most {MAX_TREE_BUDGET}, got {self.tree_budget}: one round "
                             f"verifies every node in one pass and the caches grow by the budget")

    def lookup_sampled(self, device: torch.device) -> bool:
        """Whether a round on `device` verifies lookup's rows for sampled requests (`ngram_sampled`)."""
        return self.ngram_sampled if self.ngram_sampled is not None else device.type != "cpu"

    @property
    def auto(self) -> bool:
        return self.method == "ddtree" and self.tree_budget == "auto"

    @property
    def max_budget(self) -> int:
        """The largest budget a round may use (auto picks among AUTO_BUDGETS)."""
        return max(AUTO_BUDGETS) if self.tree_budget == "auto" else self.tree_budget


def rows_per_round(spec: SpecConfig, drafter: DFlashDrafter | None, budget: int | None = None) -> int:
    """Cache rows a round may write past a slot's committed length (at tree budget `budget` where given:
    an automatic budget's round; default the largest the spec allows)."""
    if drafter is None or spec.method == "none":
        return 1 + spec.ngram_tokens
    d = drafter.config
    nodes = d.depth if spec.method == "dflash" else spec.max_budget if budget is None else budget
    return max(1 + nodes, d.block_size) + spec.ngram_tokens


@dataclass
class SlotState:
    """Per-slot device state of the running batch."""

    seq_lens: torch.Tensor  # [S] committed tokens (rows of the target and drafter caches)
    bonus: torch.Tensor  # [S] next root token: emitted, not yet in the caches
    active: torch.Tensor  # [S] bool: the slot holds a running request


@dataclass
class RoundResult:
    tree: DraftTree
    walk: Walk
    predicted: torch.Tensor | None = None  # [S, len(AUTO_BUDGETS)] expected accepted drafts (auto budget)
    clock: "StageClock | None" = None
    # [S, 1 + E (+ C)] int64: all the engine reads back after a round (`readback`), made inside the round
    # so that a CUDA graph writes it and the host's read is one copy, with no kernel launched for it.
    readback: torch.Tensor | None = None
    drafted: int | None = None  # the tree's nodes before prompt lookup's (all of them without lookup)

    @property
    def stage_seconds(self) -> dict[str, float]:
        """Seconds per stage (empty when not timed). On a GPU read it after the round's sync."""
        return self.clock.seconds() if self.clock is not None else {}


IDLE = SamplingParams(temperature=0.0)  # the sampling row of a slot without a request


@dataclass(frozen=True)
class PrefillPiece:
    """prompt[start:end] of the request in `slot`: what one prefill forward runs for that slot."""

    slot: int
    prompt: list[int]
    start: int
    end: int


@dataclass
class PrefillBatch:
    """Prompt pieces as device tensors, K pieces padded to T tokens (`Speculator.prefill_batch`)."""

    tokens: torch.Tensor  # [K, T]
    starts: torch.Tensor  # [K] position (= cache row) of each piece's first token
    lengths: torch.Tensor  # [K] real tokens of each piece (>= 1)
    slots: torch.Tensor  # [K]
    done: torch.Tensor  # [K] bool: the piece ends its prompt (its slot becomes active, its first token drawn)

    def copy_(self, other: "PrefillBatch") -> None:
        for f in dataclasses.fields(self):
            getattr(self, f.name).copy_(getattr(other, f.name))


class Speculator:
    """Owns the target, the optional drafter, their caches and the per-slot state; runs prefill and rounds.

    attention: "sdpa", "flex", "splitkv" or "hybrid" (treeflash/attention.py); default: the measured
        choice for the device and head layout (`default_backend`).
    flex_decode_tokens: new tokens up to which FlexAttention uses its decoding kernel (attention.py).
    compile_kernels: on CUDA, fused q/k/v and gate/up projections and torch.compile'd norm, rotary,
    silu*mul and residual pieces (treeflash/models/kernels.py) for the models' forwards; False: the
    eager model code, as on the CPU (which never compiles: the flag is ignored there).
    cpu_prepack: on the CPU, multiply float32 projections (and bfloat16 ones, where the CPU has bfloat16 products)
    by oneDNN prepacked copies of their weights
    (`kernels.linear`; a second copy of them in memory); False: F.linear (MKL) as everywhere else.
    """

    def __init__(self, target: Transformer, drafter: DFlashDrafter | None, spec: SpecConfig,
                 slots: int, capacity: int, time_stages: bool = True, attention: str | None = None,
                 flex_decode_tokens: int = FLEX_DECODE_TOKENS, compile_kernels: bool = True,
                 draft_vocab: bool = True, tree_kernel: bool | None = None, cpu_prepack: bool = True):
        if spec.method != "none" and drafter is None:
            raise ValueError(f"spec={spec.method!r} needs a draft model")
        self.target, self.drafter, self.spec = target, drafter if spec.method != "none" else None, spec
        self.device = target.embed_tokens.weight.device
        c = target.config
        plain = not c.window_layers and not c.attention_sinks
        self.attention = check_backend(attention or default_backend(self.device, c.head_dim, flex=plain),
                                       self.device, c.head_dim, bool(c.window_layers), c.attention_sinks)
        self.flex_decode_tokens = flex_decode_tokens
        self.tree_kernel = tree_kernel  # use_tree_kernel's setting, read per round (gpu_check E flips it)
        if self.device.type == "cuda":
            pin_triton_cache_dir()  # before any kernel compiles (its docstring says why)
            # The models are switched as a whole (shared with any other speculator on them): the last
            # one built decides their eager forwards; captured graphs keep what they recorded.
            for model in (target, self.drafter):
                if model is not None:
                    use_fast_path(model, compile_kernels, COMPILED if compile_kernels else EAGER)
        self.capacity = self.rounded(capacity)
        self.cache = target.new_cache(slots, self.capacity)
        self.draft_cache = self.drafter.new_cache(slots, self.capacity) if self.drafter else None
        # Prompt lookup reads each slot's committed tokens: written by prefill and commit, never read back.
        self.history = torch.zeros(slots, self.capacity, dtype=torch.long, device=self.device) \
            if spec.ngram_tokens else None
        self.capture = self.drafter.config.target_layer_ids if self.drafter else ()
        # A draft vocabulary (DraftVocab): the drafter ranks only these tokens, through a copy of their lm_head
        # rows made once here; trees hold their positions in it until `build` maps them back to token ids.
        vocab = self.drafter.draft_vocab if self.drafter is not None and draft_vocab else None
        self.draft_tokens = self.draft_head = None
        if vocab is not None:
            vocab.check_target(target.config.vocab_size)
            self.draft_tokens = torch.tensor(vocab.token_ids, dtype=torch.long, device=self.device)
            self.draft_head = target.output_weight.detach().index_select(0, self.draft_tokens)
        if self.device.type == "cpu" and cpu_prepack:
            # (every engine built packs again: a drafter trained since its last engine is packed as it is now)
            weights = projection_weights(target) + [target.output_weight, self.draft_head]
            weights += projection_weights(self.drafter) if self.drafter is not None else []
            prepack_cpu(list({id(w): w for w in weights if w is not None}.values()))  # (a tied head is listed twice)
        zeros = lambda dtype: torch.zeros(slots, dtype=dtype, device=self.device)  # noqa: E731
        self.state = SlotState(zeros(torch.long), zeros(torch.long), zeros(torch.bool))
        self.time_stages = time_stages
        # Static sampling rows, written at admission; the flags follow the running requests.
        self.slot_params: list[SamplingParams | None] = [None] * slots
        self.sampling_rows = SamplingTensors.build([IDLE] * slots, [0] * slots, self.device)
        # Generated-token counts and prompt tokens per slot, made when a request with a penalty first comes
        # (treeflash/penalties.py); rounds read and update them only while such a request runs (`flags`).
        self.penalty_counts: PenaltyCounts | None = None
        # Each slot's logit_bias as a dense row [slots, V] (-inf outside its allowed_token_ids), made when a
        # request with either first comes.
        self.logit_bias: torch.Tensor | None = None
        # min_tokens: each slot's stop tokens and first stop position, made when a request with it first comes.
        self.stop_suppression: StopSuppression | None = None
        self.bad_words: BadWords | None = None  # bad_words' sequences and each slot's recent output
        self.structure: GrammarSlots | None = None  # structured outputs' automata and each slot's state
        # Drafts under the requests' logit bias, penalties, min_tokens and structures where known before the
        # tree (`adjusted_drafts`); False drafts blind to them (benchmarks/cpu-draft-adjustments and
        # benchmarks/cpu-structured compare the two).
        self.adjust_drafts = True
        self._flags: SamplingFlags | None = SamplingFlags()  # None: stale, recomputed at next read
        self.auto_budgets = torch.tensor(AUTO_BUDGETS, device=self.device)

    @property
    def slots(self) -> int:
        return self.state.seq_lens.shape[0]

    def rounded(self, capacity: int) -> int:
        # FlexAttention works in blocks of 128 rows: a whole number of them keeps its kernels simple. SDPA's
        # CPU kernel takes keys in blocks of 512: over whole blocks a row's bits do not depend on how many
        # masked rows follow (tests/test_attention_width.py), so the capacity, every eager round's and prefill's
        # width are whole blocks, and a request's numbers do not follow its neighbours' lengths.
        block = FLEX_BLOCK if self.attention in ("flex", "hybrid") else SDPA_KV_BLOCK if self.attention == "sdpa" else 1
        return -(-capacity // block) * block

    def attend_width(self, rows: int) -> int:
        """Cache rows an eager forward attends over to see rows [0, rows): whole blocks (`rounded`), at
        most the capacity. Only SDPA (the CPU's attention) narrows: the GPU kernels' cost follows the rows
        in use, and their graphs are captured over the whole capacity."""
        return min(self.rounded(max(rows, 1)), self.capacity) if self.attention == "sdpa" else self.capacity

    def layout(self, seq_lens: torch.Tensor, new_mask: torch.Tensor, kv_len: int | None = None
               ) -> tuple[torch.Tensor, object]:
        """Rows and attention mask of new tokens over cache rows [0, kv_len) (default: the whole cache;
        see treeflash/attention.py)."""
        return round_layout(seq_lens, new_mask, kv_len or self.capacity, self.attention, self.flex_decode_tokens)

    # --- sampling rows ---------------------------------------------------------------------------
    def set_sampling_many(self, slots: list[int], params: list[SamplingParams | None],
                          seeds: list[int], prompts: list[list[int]] | None = None,
                          stop_ids: list | None = None, bad_words: list | None = None,
                          grammars: list | None = None) -> SamplingTensors:
        """Write requests' sampling parameters into their slots' static rows (None: the slot is free) and
        mark the flags stale (recomputed once, when a round reads them); returns the requests' rows.
        prompts: the requests' prompts, which a repetition penalty counts as seen (where any has a penalty;
        None: no prompt token counts). stop_ids: each request's stop tokens (EOS included unless it ignores
        it), which min_tokens holds back; min_tokens needs both. bad_words: each request's bad words as token
        sequences (`bad_word_sequences`), which params.bad_words needs. grammars: each request's automaton
        (`GrammarCompiler.compile`), which params.structured_outputs needs."""
        if stop_ids is None or prompts is None:
            if any(p is not None and p.min_tokens for p in params):
                raise ValueError("min_tokens needs the requests' prompts and stop token ids")
        if bad_words is None and any(p is not None and p.bad_words for p in params):
            raise ValueError("bad_words needs the requests' token sequences (bad_word_sequences)")
        if grammars is None and any(p is not None and p.structured_outputs is not None for p in params):
            raise ValueError("structured_outputs needs the requests' automata (GrammarCompiler.compile)")
        rows = SamplingTensors.build([p or IDLE for p in params], seeds, self.device)
        index = to_device(slots, self.device, torch.long)
        for f in dataclasses.fields(SamplingTensors):
            value = getattr(rows, f.name)
            if isinstance(value, torch.Tensor):
                getattr(self.sampling_rows, f.name).index_copy_(0, index, value)
        for slot, p in zip(slots, params):
            self.slot_params[slot] = p
        if self.penalty_counts is None and any(p is not None and p.penalized for p in params):
            self.penalty_counts = PenaltyCounts.new(self.slots, self.target.config.vocab_size, self.device)
        if self.logit_bias is None and any(p is not None and p.masked for p in params):
            self.logit_bias = torch.zeros(self.slots, self.target.config.vocab_size, device=self.device)
        if self.logit_bias is not None:
            bias = torch.zeros(len(slots), self.logit_bias.shape[1])
            for row, p in enumerate(params):
                if p is not None and p.allowed_token_ids is not None:
                    bias[row] = float("-inf")
                    bias[row, p.allowed_token_ids] = 0.0
                for token, value in (p.logit_bias or {}).items() if p is not None else ():
                    bias[row, token] += value  # (a token not allowed stays -inf)
            self.logit_bias[index] = to_device(bias, self.device)
        if self.stop_suppression is None and any(p is not None and p.min_tokens for p in params):
            self.stop_suppression = StopSuppression.new(self.slots, self.target.config.vocab_size, self.device)
        if self.stop_suppression is not None:
            early = [p is not None and p.min_tokens > 0 for p in params]
            self.stop_suppression.start(slots, [stop_ids[i] if e else None for i, e in enumerate(early)],
                                        [len(prompts[i]) + params[i].min_tokens if e else 0
                                         for i, e in enumerate(early)])
        if self.bad_words is None and any(p is not None and p.bad_words for p in params):
            self.bad_words = BadWords.new(self.slots, self.device)
        if self.bad_words is not None:
            self.bad_words.start(slots, [seqs if p is not None and p.bad_words else None
                                         for p, seqs in zip(params, bad_words or [None] * len(slots))])
        if self.structure is None and any(p is not None and p.structured_outputs is not None for p in params):
            self.structure = GrammarSlots(self.slots, self.target.config.vocab_size, self.device)
        if self.structure is not None:
            self.structure.start(slots, [g if p is not None and p.structured_outputs is not None else None
                                         for p, g in zip(params, grammars or [None] * len(slots))])
        if self.penalty_counts is not None:
            self.penalty_counts.start(slots, [prompt if p is not None and p.penalized else None
                                              for p, prompt in zip(params, prompts or [None] * len(slots))])
        self._flags = None  # recomputed when a round reads them: once per round, not per request
        return rows

    @property
    def flags(self) -> SamplingFlags:
        """The sampling flags of the requests in the slots (all greedy when there are none)."""
        if self._flags is None:
            self._flags = SamplingFlags.of([p for p in self.slot_params if p is not None] or [IDLE])
        return self._flags

    def sampling(self, num_slots: int) -> SamplingTensors:
        """The static rows of slots [0, num_slots) with the running requests' flags (views, no copy)."""
        rows = self.sampling_rows
        views = {f.name: getattr(rows, f.name)[:num_slots] for f in dataclasses.fields(SamplingTensors)
                 if isinstance(getattr(rows, f.name), torch.Tensor)}
        return dataclasses.replace(rows, **views, flags=self.flags)

    # --- prefill ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill_many(self, pieces: list[PrefillPiece]) -> torch.Tensor:
        """Run several slots' prompt pieces into their caches in ONE forward; returns the logits after
        each piece's last token [k, V].

        Piece i is prompt[start:end] of its slot (distinct slots); rows [0, start) of the slot must
        already hold prompt[:start]. The pieces are padded to one length T: token t of a piece sits at
        position and cache row start + t and sees the slot's rows before it (a causal mask per slot).
        Padded tokens are never stored (`SlotSelection.real`) and no real token sees them, so they
        change nothing: their own outputs are garbage, and dropped. Each slot's committed length
        becomes `end`; a slot is active once its whole prompt is in (until then rounds leave its
        committed rows alone: they only write past them, where the next piece overwrites).
        """
        batch = self.prefill_batch(pieces)
        last = self.prefill_forward(batch, max(p.end for p in pieces), self.real_tokens(pieces))
        self.commit_prefill(batch)
        return self.target.logits(last)

    @torch.inference_mode()
    def prefill_and_start(self, batch: PrefillBatch, kv_len: int,
                          real: tuple[torch.Tensor, torch.Tensor] | None = None,
                          out: torch.Tensor | None = None, prompt_next: torch.Tensor | None = None) -> torch.Tensor:
        """`prefill_forward` of the pieces, then what admission does after it, all on the device: commit
        each slot's length, and draw the first token of each piece that ends its prompt (`done`) from the
        logits after it with the slot's sampling row (written beforehand, `set_sampling_many`) at
        position len(prompt) (the counter key plain decoding uses); it becomes the slot's first root.
        Returns every piece's read-back [K, 1 (+ L)]: its draw (an unfinished piece's is unused and written
        nowhere), then, when a request asks for log-probs, the draw's packed ones (treeflash/logprobs.py); in
        `out` where given (the runner's buffer, outside its graphs' shared pool). Capturable: a prefill
        graph replays all of it, so admitting a request costs the host the replay and one read, not the
        ~30 eager ops of commit, lm_head and draw (benchmarks/admission).

        prompt_next: [K, T] the prompt token after each of the pieces' positions (`prompt_next`), where a
        request asks for prompt log-probs: every piece's read-back then ends in T x COLUMNS more columns, the
        packed log-prob of each position's next token under the logits there (vocabulary-wide rows at every
        position, a chunk of rows at a time: eager work, never captured)."""
        hidden = self.prefill_forward(batch, kv_len, real, every=prompt_next is not None)
        last = hidden if prompt_next is None else hidden[torch.arange(len(hidden), device=self.device),
                                                         batch.lengths - 1]
        self.commit_prefill(batch)
        rows = dataclasses.replace(self.sampling_rows.rows(batch.slots), flags=self.flags)
        ends = (batch.starts + batch.lengths)[:, None]
        logits = self.target.logits(last)
        first = derive(self.adjusted_logits(logits[:, None], rows, batch.slots, ends), rows, ends)[:, 0]
        if self.flags.use_penalties:
            self.penalty_counts.first(batch.slots, batch.done, first)
        if self.flags.use_bad_words:
            self.bad_words.first(batch.slots, batch.done, first)
        if self.flags.use_structure:
            self.structure.first(batch.slots, batch.done, first)
        self.state.bonus[batch.slots] = torch.where(batch.done, first, self.state.bonus[batch.slots])
        parts = [first[:, None]] + ([pack(logits, first)] if self.flags.logprobs else [])
        if prompt_next is not None:
            parts.append(self.prompt_logprobs(hidden, prompt_next).flatten(1))
        return torch.cat(parts, 1) if out is None else torch.cat(parts, 1, out=out)

    def prompt_logprobs(self, hidden: torch.Tensor, following: torch.Tensor,
                        rows_at_once: int = 256) -> torch.Tensor:
        """hidden [K, T, H] the prefill's final hidden states, following [K, T] the token after each position
        -> [K, T, COLUMNS]: that token's packed log-prob under the target's logits there (its raw
        distribution, as generated tokens' log-probs), `rows_at_once` positions' logits at a time so a long
        piece never holds T vocabulary-wide rows."""
        flat, nxt = hidden.flatten(0, 1), following.flatten()
        packed = [pack(self.target.logits(flat[i:i + rows_at_once]), nxt[i:i + rows_at_once])
                  for i in range(0, len(flat), rows_at_once)]
        return torch.cat(packed).view(*following.shape, -1)

    def prompt_next(self, pieces: list[PrefillPiece], length: int | None = None) -> torch.Tensor:
        """[K, T] each piece position's next prompt token, padded to `length` (the pieces' padded length) with
        0; a piece that ends its prompt has no next token at its last position (0 there, never read)."""
        t = length or max(p.end - p.start for p in pieces)
        rows = [p.prompt[p.start + 1:p.end + 1] for p in pieces]
        return to_device([r + [0] * (t - len(r)) for r in rows], self.device)

    def real_tokens(self, pieces: list[PrefillPiece]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(batch index, token index) of the pieces' real tokens when they differ in length (padding is then
        not stored: `SlotSelection.real`), from the host's lengths (no device read); None when none is padded."""
        lengths = [p.end - p.start for p in pieces]
        if min(lengths) == max(lengths):
            return None
        valid = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
        return tuple(to_device(x, self.device) for x in valid.nonzero(as_tuple=True))

    def prefill_batch(self, pieces: list[PrefillPiece], num: int | None = None,
                      length: int | None = None) -> PrefillBatch:
        """The pieces as device tensors, padded to `length` tokens (default: the longest piece's) and
        `num` pieces (default: as many as given; extra ones repeat the first piece, which writes the
        same values to the same rows again)."""
        k, lengths = len(pieces), [p.end - p.start for p in pieces]
        if k == 0 or min(lengths) < 1 or len({p.slot for p in pieces}) < k:
            raise ValueError("prefill takes non-empty pieces of distinct slots")
        t, num = length or max(lengths), num or k
        if t < max(lengths) or num < k:
            raise ValueError(f"cannot pad {k} pieces of up to {max(lengths)} tokens to {num} x {t}")
        padded = pieces + [pieces[0]] * (num - k)
        return PrefillBatch(
            tokens=to_device([p.prompt[p.start:p.end] + [0] * (t - p.end + p.start) for p in padded], self.device),
            starts=to_device([p.start for p in padded], self.device),
            lengths=to_device([p.end - p.start for p in padded], self.device),
            slots=to_device([p.slot for p in padded], self.device),
            done=to_device([p.end == len(p.prompt) for p in padded], self.device))

    @torch.inference_mode()
    def prefill_forward(self, batch: PrefillBatch, kv_len: int,
                        real: tuple[torch.Tensor, torch.Tensor] | None = None, every: bool = False) -> torch.Tensor:
        """The forward of `prefill_many` on device tensors alone: K pieces of T tokens into their slots'
        caches, attending over rows [0, kv_len) (kv_len >= every piece's end). Returns the final hidden
        state of each piece's last real token [K, hidden] (`target.logits` of it: the logits after the
        piece; a graph then owns K hidden rows, not K vocabulary-wide rows), or with every=True all of
        them [K, T, hidden] (prompt log-probs). With real=None every token
        is stored, padding too, at rows start+t: the caller makes sure those rows exist (start + T <=
        capacity); rows past a piece's end lie beyond its slot's committed length, where nothing reads
        them before they are overwritten. Nothing here reads a device value on the host, so it can be
        captured (treeflash/runner.py). With the splitkv kernels (the "splitkv" and "hybrid" backends) the
        attention reads and stores each piece's slot in place; otherwise a dense mask over kv_len rows
        (SDPA): on the H200 a 150-token SmolLM2 prompt's graph took 1.27 ms against 2.27
        (benchmarks/admission)."""
        k, t = batch.tokens.shape
        dev = self.device
        positions = batch.starts[:, None] + torch.arange(t, device=dev)  # [K, T]; also the cache rows
        # Among the new tokens: causal, and only real tokens are visible, but for each padding token itself:
        # no query row is all-masked, a sliding window's too (a row that saw nothing would store NaN keys,
        # which a dense mask's zero weight would not cancel).
        causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
        real_cols = torch.arange(t, device=dev)[None, None, :] < batch.lengths[:, None, None]
        new_mask = causal[None] & (real_cols | torch.eye(t, dtype=torch.bool, device=dev))
        if self.attention in ("splitkv", "hybrid"):  # the splitkv kernels, told each piece's slot (attend_new)
            mask = SplitKVMask(batch.starts.to(torch.int32), new_mask.to(torch.uint8), kv_len)
        else:
            _, mask = append_layout(batch.starts, new_mask, kv_len)
        hidden, features = self.target(batch.tokens, positions, self.cache.select(batch.slots, real), positions,
                                       mask, self.capture)
        if self.drafter:
            self.drafter.add_context(self.drafter.context_features(self.target, features), positions,
                                     self.draft_cache.select(batch.slots, real), positions)
        return hidden if every else hidden[torch.arange(k, device=dev), batch.lengths - 1]

    def commit_prefill(self, batch: PrefillBatch) -> None:
        """After the pieces' forward: each slot's committed length becomes its piece's end, and a slot
        whose whole prompt is in becomes active (device tensors alone: capturable)."""
        self.state.seq_lens[batch.slots] = (batch.starts + batch.lengths).to(self.state.seq_lens.dtype)
        self.state.active[batch.slots] = batch.done
        if self.history is not None:  # the pieces' real tokens (a padded one's tail rewrites its last row)
            at = batch.starts[:, None] + torch.arange(batch.tokens.shape[1], device=self.device).clamp_max(
                batch.lengths[:, None] - 1)
            tokens = batch.tokens.gather(1, (at - batch.starts[:, None]))
            self.history[batch.slots[:, None].expand_as(at), at] = tokens

    def prefill(self, slot: int, prompt: list[int], chunk: int = PREFILL_CHUNK, start: int = 0,
                activate: bool = True) -> torch.Tensor:
        """Run prompt[start:] into `slot`'s caches, in chunks; returns the logits after its last token [V].

        Rows [0, start) must already hold prompt[:start] (an earlier call). The slot's committed length
        becomes len(prompt). activate=False leaves a slot whose prompt is only partly in inactive: rounds
        then leave its committed length alone (they only write rows past it, which the next chunk
        overwrites).
        """
        for begin in range(start, len(prompt), chunk):
            logits = self.prefill_many([PrefillPiece(slot, prompt, begin, min(begin + chunk, len(prompt)))])
        self.state.active[slot] = activate
        return logits[0]

    def admit(self, slot: int, prompt: list[int], params: SamplingParams, seed: int, start: int = 0) -> torch.Tensor:
        """Prefill `slot` with prompt[start:] (earlier rows already hold the rest), write its sampling row
        and draw its first token (the first round's root), as the engine admits a request
        (`prefill_and_start`, eagerly, a chunk at a time). Returns it as a [1] device tensor.
        """
        self.set_sampling_many([slot], [params], [seed], [prompt], [set(params.stop_token_ids or [])])
        for begin in range(start, len(prompt), PREFILL_CHUNK):
            piece = PrefillPiece(slot, prompt, begin, min(begin + PREFILL_CHUNK, len(prompt)))
            first = self.prefill_and_start(self.prefill_batch([piece]), piece.end)
        return first[:, 0]

    def set_bonus(self, slot: int, token: int) -> None:
        self.state.bonus[slot] = token

    def reserve(self, capacity: int) -> None:
        """Grow the caches to hold `capacity` rows per slot; committed rows are kept.

        The caches are new tensors afterwards: captured CUDA graphs of the old ones are stale (the
        runner notices the new capacity and captures again)."""
        capacity = self.rounded(capacity)
        if capacity > self.capacity:
            self._resize(capacity)

    def shrink(self, capacity: int) -> None:
        """Caches of `capacity` rows per slot again, where they are longer: memory back once no slot holds a
        row past it (the caller's word: rows past it are dropped). Graphs of the old caches are stale, as after
        `reserve`."""
        capacity = self.rounded(capacity)
        if capacity < self.capacity:
            self._resize(capacity)

    def _resize(self, capacity: int) -> None:
        self.cache.resize_(capacity)
        if self.draft_cache is not None:
            self.draft_cache.resize_(capacity)
        if self.history is not None:
            history = self.history.new_zeros(self.slots, capacity)
            kept = min(capacity, self.capacity)
            history[:, :kept] = self.history[:, :kept]
            self.history = history
        self.capacity = capacity

    def copy_prefix(self, src: int, dst: int, rows: int) -> None:
        """Slot `dst`'s first `rows` committed rows become slot `src`'s: the target's and the drafter's caches
        and prompt lookup's tokens (treeflash/prefix_reuse.py); its committed length becomes `rows`."""
        if src != dst:
            for cache in (self.cache, self.draft_cache):
                if cache is not None:
                    cache.copy_rows(src, dst, rows)
            if self.history is not None:
                self.history[dst, :rows] = self.history[src, :rows]
        self.state.seq_lens[dst] = rows

    def release(self, slot: int) -> None:
        self.release_many([slot])

    def release_many(self, slots: list[int], keep: list[int] | None = None) -> None:
        """Free slots: inactive, idle sampling rows, and empty past their first `keep` rows (default none:
        the rows of a prompt prefix kept for reuse, which the rounds run over a free slot then write past).
        One batch of small writes for all of them (a step that retires many requests pays it once, not per
        request)."""
        if not slots:
            return
        index = to_device(slots, self.device, torch.long)
        self.state.seq_lens[index] = 0 if keep is None else to_device(keep, self.device, self.state.seq_lens.dtype)
        self.state.active[index] = False
        self.set_sampling_many(slots, [None] * len(slots), [0] * len(slots))

    # --- the round -------------------------------------------------------------------------------
    @torch.inference_mode()
    def round(self, num_slots: int, budget: int | None = None, sampling: SamplingTensors | None = None,
              clock=None, readback_out: torch.Tensor | None = None, kv_rows: int | None = None) -> RoundResult:
        """One round over slots [0, num_slots).

        budget: tree nodes this round (ddtree; default the spec's fixed budget; 0: no draft this round,
        only the root is verified, as in plain decoding, and its features still reach the drafter's
        cache). sampling: per-slot
        parameters (default: the static rows written at admission). clock: anything with
        `lap(stage)`, called after each stage (default: a StageClock when time_stages is on).
        readback_out: where to write the read-back (the runner's buffer, outside its graphs' shared pool).
        kv_rows: at least every slot's committed rows plus what the round writes (the engine knows it on the
        host); eager SDPA rounds then attend over `attend_width(kv_rows)` rows, not the whole cache: a
        server's cache grown for one long request no longer slows every later round.
        Slots without a request run along (their results are ignored): a prefix of the slots keeps
        every tensor a view, with no gathers of the caches.
        """
        s = self.state
        state = SlotState(*(t[:num_slots] for t in (s.seq_lens, s.bonus, s.active)))
        cache = _prefix(self.cache, num_slots)
        sampling = self.sampling(num_slots) if sampling is None else sampling
        if clock is None and self.time_stages:
            clock = StageClock(self.device)
        lap = clock.lap if clock is not None else (lambda stage: None)

        # Budget 0 (the automatic budget's NO_DRAFT): no draft, the tree is the root alone.
        layout = functools.partial(self.layout, kv_len=self.attend_width(kv_rows) if kv_rows else None)
        logprobs = self.draft(state, sampling, self.draft_depths(budget), layout) if budget != NO_DRAFT else None
        lap("draft")
        tree = self.build(state.bonus, logprobs, budget)
        drafted = tree.size  # (nodes past these are prompt lookup's)
        if self.history is not None and budget != NO_DRAFT:  # (NO_DRAFT: plain decoding's step, as weighed)
            tree = graft_lookup(tree, self.history[:num_slots], state.seq_lens, state.bonus, self.spec.ngram_tokens)
            keep = None if self.spec.lookup_sampled(self.device) or sampling.flags.all_greedy else sampling.greedy
            if self.device.type == "cpu":  # (eager: rows the lookup left invalid are not worth verifying)
                tree = compact_lookup(tree, drafted, keep)
            elif keep is not None:
                tree = keep_slots(tree, drafted, keep)
        predicted = expected_drafts(tree, self.auto_budgets) if self.spec.auto else None
        lap("tree")
        positions = state.seq_lens[:, None] + tree.depths
        logits, features = self.verify(tree, positions, state, cache, layout)
        lap("verify")
        derived = derive(self.adjusted_logits(logits, sampling, slice(0, num_slots), positions + 1, tree), sampling,
                         positions + 1)
        accepted = self.walk(tree, derived)
        packed = emitted_logprobs(logits, accepted.path, accepted.emitted) if sampling.flags.logprobs else None
        lap("derive_walk")
        self.commit(accepted, features, state, cache, num_slots)
        if sampling.flags.use_penalties:
            self.penalty_counts.add(accepted.emitted, accepted.accepted)
        if sampling.flags.use_bad_words:
            self.bad_words.add(accepted.emitted, accepted.accepted)
        if sampling.flags.use_structure:
            self.structure.add(accepted.emitted, accepted.accepted)
        # (before the last lap: a stage-split capture ends its graphs there)
        rows = readback(accepted, predicted, packed, readback_out)
        lap("commit")
        return RoundResult(tree, accepted, predicted, clock if isinstance(clock, StageClock) else None, rows, drafted)

    def budget(self, budget: int | None) -> int:
        """The tree budget of a round: the one asked for, else the spec's fixed one."""
        if budget is not None:
            return budget
        if self.spec.tree_budget == "auto":
            raise ValueError("tree_budget='auto' needs the round's budget from the engine's budget chooser")
        return self.spec.tree_budget

    def draft_depths(self, budget: int | None) -> int | None:
        """Depths whose draft distributions a round can use (None: all of the block's).

        A tree of B nodes reaches depth B at most (a node needs its ancestors in the tree, and the
        builder ranks a prefix after its ancestors), so with a fixed DDTree budget below the block's
        depth the deeper positions never reach the lm_head: the tree, hence every token, is the same,
        and a small budget skips most of the drafter's vocabulary-wide logits (the bulk of a CPU
        draft). The automatic budget's rounds too: its estimate m(B) for budgets past the one in use
        then ranks only prefixes within these depths (a lower bound, as m past the budget in use is
        anyway), and a round costs what a fixed budget's does (keeping every depth made a budget-4
        round on the CPU cost 1.35x a fixed one, and auto chose not to draft where drafting paid).
        """
        if self.drafter is None or self.spec.method != "ddtree" or budget == NO_DRAFT:
            return None
        nodes = self.budget(budget)
        return nodes if nodes < self.drafter.config.depth else None

    def draft(self, state: SlotState, sampling: SamplingTensors, depths: int | None = None, layout=None
              ) -> torch.Tensor | None:
        """Draft log-probs [S, depths or block_size - 1, V] from one drafter pass (None without a drafter);
        with a draft vocabulary, over its N tokens ([..., N]: `build` maps positions back to token ids)."""
        if self.drafter is None:
            return None
        cache = _prefix(self.draft_cache, state.bonus.shape[0])
        logits = self.drafter.draft(self.target, state.bonus, state.seq_lens, cache, layout or self.layout, depths,
                                    self.draft_head)
        logits = self.adjusted_drafts(logits, sampling, state)
        # Rank drafts by the drafter's guess of each request's *tempered* distribution. All-greedy
        # batches (host-known, part of a graph's key) have temperature 1.0 on every row: x / 1.0 is x.
        return draft_log_probs(logits, None if sampling.flags.all_greedy else sampling.temperature)

    def adjusted_drafts(self, logits: torch.Tensor, sampling: SamplingTensors, state: SlotState) -> torch.Tensor:
        """The drafter's logits [S, D, V'] (V': the draft vocabulary's, or the whole) under what the requests
        change in the target's where it is known before the tree exists: the bias row (logit_bias,
        allowed_token_ids), penalties from the output so far (not the drafted path) and min_tokens' stop tokens
        by depth, and a structure along the drafts' most likely chain (`GrammarSlots.apply_drafts`); bad words
        are not applied here. Only the drafts change, never the output (the target derives every token), so
        this moves acceptance alone: a drafter blind to a repetition penalty keeps proposing the repeats the
        target now avoids. A row left with no finite logit keeps the drafter's own."""
        flags = sampling.flags
        if not self.adjust_drafts or not (flags.use_logit_bias or flags.use_penalties or flags.use_min_tokens
                                          or flags.use_structure):
            return logits
        self._check_rows(flags)
        s, depths = logits.shape[:2]
        cols = (lambda x: x) if self.draft_tokens is None else (lambda x: x[:, self.draft_tokens])  # noqa: E731
        out = logits.float()
        if flags.use_logit_bias:
            out = out + cols(self.logit_bias[:s])[:, None]
        if flags.use_penalties:
            counts = self.penalty_counts
            out = penalize(out, sampling.repetition, sampling.frequency, sampling.presence, cols(counts.output[:s]),
                           cols(counts.prompt[:s]))
        if flags.use_min_tokens:
            # The drafted token at depth d + 1 is drawn at position seq_len + d + 1 (its parent's draw).
            drawn_at = state.seq_lens[:s, None] + 1 + torch.arange(depths, device=logits.device)
            out = self.stop_suppression.apply(out, slice(0, s), drawn_at, self.draft_tokens)
        if flags.use_logit_bias:  # (only allowed_token_ids make -inf: neither penalties nor min_tokens' few)
            out = torch.where(torch.isfinite(out).any(-1, keepdim=True), out, logits.float())
        if flags.use_structure:
            out = self.structure.apply_drafts(out, slice(0, s), self.draft_tokens)
        return out

    def build(self, bonus: torch.Tensor, logprobs: torch.Tensor | None, budget: int | None = None) -> DraftTree:
        if logprobs is None:
            return root_only(bonus)
        if self.spec.method == "dflash":
            tree = build_chain(bonus, logprobs)
        elif use_tree_kernel(self.tree_kernel, self.device, logprobs.shape[1], nodes := self.budget(budget)):
            from treeflash.tree_kernel import build_tree_kernel

            tree = build_tree_kernel(bonus, logprobs, budget=nodes)
        else:
            tree = build_tree(bonus, logprobs, budget=nodes)
        if self.draft_tokens is None:
            return tree
        # Drafted nodes hold positions in the draft vocabulary; the root is the bonus token itself.
        drafted = self.draft_tokens[tree.tokens[:, 1:]]
        return dataclasses.replace(tree, tokens=torch.cat([tree.tokens[:, :1], drafted], dim=1))

    def verify(self, tree: DraftTree, positions: torch.Tensor, state: SlotState, cache: KVCache, layout=None):
        """One target forward over root + nodes at their depth positions, ancestor-only mask.

        Returns the logits at every node [S, N, V] and the drafter's features at every node (or None).
        """
        rows, mask = (layout or self.layout)(state.seq_lens, self.ancestor_mask(tree))
        hidden, features = self.target(tree.tokens, positions, cache, rows, mask, self.capture)
        return self.target.logits(hidden), self.drafter.context_features(self.target, features) if features else None

    def adjusted_logits(self, logits: torch.Tensor, sampling: SamplingTensors, rows: torch.Tensor | slice,
                        positions: torch.Tensor, tree: DraftTree | None = None) -> torch.Tensor:
        """logits [S, N, V] of slots `rows` drawing at `positions` [S, N], after the requests' logit_bias (and
        allowed_token_ids, in the same row), structured outputs, bad_words, penalties and min_tokens in vLLM's
        order (treeflash/structured.py, treeflash/penalties.py, treeflash/bad_words.py), each only where a
        running request uses it (host-known flags: no device read). tree: the round's, whose nodes' drafted
        paths go into their structure states, bad-word pasts and penalty counts, what plain decoding would see
        at those positions; None at prefill, where nothing is generated yet."""
        flags = sampling.flags
        self._check_rows(flags)
        if flags.use_logit_bias:
            logits = logits.float() + self.logit_bias[rows][:, None]
        if flags.use_structure:
            logits = self.structure.apply(logits, rows, tree, prefill=tree is None)
        # (on CUDA the penalty kernel walks the tree's parents itself: only bad words read the mask there)
        paths = flags.use_bad_words or (flags.use_penalties and not logits.is_cuda)
        ancestors = None if tree is None or not paths or tree.size == 1 else self.ancestor_mask(tree)
        if flags.use_bad_words:
            logits = self.bad_words.apply(logits, rows, tree, ancestors)
        if flags.use_penalties:
            counts = self.penalty_counts
            logits = penalize(logits, sampling.repetition, sampling.frequency, sampling.presence,
                              None if tree is None else counts.output[rows], counts.prompt[rows],
                              None if tree is None else tree.tokens, ancestors, tree)
        if flags.use_min_tokens:
            logits = self.stop_suppression.apply(logits, rows, positions)
        return logits

    def _check_rows(self, flags: SamplingFlags) -> None:
        """Sampling rows passed to a round without set_sampling_many leave a flag's per-slot state unmade."""
        if (flags.use_penalties and self.penalty_counts is None) or (flags.use_min_tokens and self.stop_suppression
                                                                     is None) or (flags.use_bad_words and
                                                                                  self.bad_words is None) or (
                flags.use_structure and self.structure is None):
            raise ValueError("penalties, min_tokens, bad_words and structured outputs need the slots' rows: write the "
                             "requests' rows with set_sampling_many first")

    def ancestor_mask(self, tree: DraftTree) -> torch.Tensor:
        """The verify mask: `tree.ancestor_mask`, or on CUDA the same in one Triton launch."""
        if use_path_kernels(self.tree_kernel, self.device):
            from treeflash.walk_kernel import ancestor_mask_kernel  # Triton: imported on CUDA only

            return ancestor_mask_kernel(tree)
        return ancestor_mask(tree)

    def walk(self, tree: DraftTree, derived: torch.Tensor) -> Walk:
        """The accepted path: `tree.walk`, or on CUDA the same in one Triton launch."""
        if use_path_kernels(self.tree_kernel, self.device):
            from treeflash.walk_kernel import walk_kernel

            return walk_kernel(tree, derived)
        return walk(tree, derived)

    def commit(self, accepted: Walk, features: torch.Tensor | None, state: SlotState, cache: KVCache,
               num_slots: int) -> None:
        """Keep the accepted path's KV rows, give the drafter their features, advance the slots."""
        if self.drafter is not None or self.history is not None:  # (a root-only tree, AR, keeps its one row)
            cache.compact(state.seq_lens, accepted.path)
        if self.history is not None:  # the path's tokens: the root, then each accepted node, the token
            # emitted at its parent (past what is accepted they lie beyond the committed length: unread)
            rows = state.seq_lens[:, None] + torch.arange(accepted.path.shape[1], device=self.device)
            path_tokens = torch.cat([state.bonus[:, None], accepted.emitted[:, :-1]], 1)
            self.history[:num_slots].scatter_(1, rows, path_tokens)
        if self.drafter is not None:
            path_features = features.gather(1, accepted.path[:, :, None].expand(-1, -1, features.shape[-1]))
            rows = state.seq_lens[:, None] + torch.arange(accepted.path.shape[1], device=self.device)
            self.drafter.add_context(path_features, rows, _prefix(self.draft_cache, num_slots), rows)
        state.bonus.copy_(accepted.emitted.gather(1, (accepted.accepted - 1)[:, None])[:, 0])
        # Idle slots stay put, so their garbage rounds never write past the cache.
        state.seq_lens.add_(accepted.accepted * state.active)


def readback(accepted: Walk, predicted: torch.Tensor | None, logprobs: torch.Tensor | None = None,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """What the engine reads after a round, in one int64 tensor [S, 1 + E (+ C) (+ E x L)]: per slot the tokens
    emitted (accepted), the emitted tokens [E], with the automatic budget m(B) for each of the C candidate
    budgets as fixed point (x PREDICTED_SCALE), and when a request asks for log-probs the emitted tokens'
    packed ones ([S, E, L], treeflash/logprobs.py). Written into `out` where given."""
    parts = [accepted.accepted[:, None], accepted.emitted]
    if predicted is not None:
        parts.append((predicted * PREDICTED_SCALE).round().long())
    if logprobs is not None:
        parts.append(logprobs.flatten(1))
    return torch.cat(parts, 1) if out is None else torch.cat(parts, 1, out=out)


def draft_log_probs(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """log_softmax(logits / temperature) over the vocabulary, float32: logits [S, D, V], temperature [S] (None: 1).
    On CUDA two Triton kernels that spread each row over many programs (treeflash/vocab_rows.py)."""
    if logits.is_cuda:
        from treeflash.vocab_rows import log_softmax_rows  # Triton: imported on CUDA only

        return log_softmax_rows(logits, temperature)
    logits = logits.float()
    return torch.log_softmax(logits if temperature is None else logits / temperature[:, None, None], dim=-1)


def _prefix(cache: KVCache, slots: int) -> KVCache:
    return cache.slots(0, slots)


class StageClock:
    """Time per stage of a round: the host clock on the CPU; on a GPU, CUDA events recorded on the
    stream (no synchronisation), read by `seconds()` after the round's one sync."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = [("", self._mark())]

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def lap(self, stage: str) -> None:
        self.marks.append((stage, self._mark()))

    def seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for (_, start), (stage, end) in zip(self.marks, self.marks[1:]):
            out[stage] = out.get(stage, 0.0) + (start.elapsed_time(end) / 1e3 if self.cuda else end - start)
        return out

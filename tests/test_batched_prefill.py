"""Batched prefill: several requests' prompt pieces in one target forward give what one-at-a-time prefill
gives (first tokens, committed cache rows, greedy and seeded outputs), and padding stores nothing.

Cache rows and logits are compared to 1e-5 and tokens exactly: bitwise equality depends on the CPU's
kernels (row-stable products, attention over whole key blocks), which tests/test_attention_width.py checks
on its own.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from treeflash import LLM, SamplingParams
from treeflash.checkpoint import load_drafter, load_target
from treeflash.engine import EngineConfig
from treeflash.round import PrefillPiece, SpecConfig, Speculator
from treeflash.runner import GraphRunner, PrefillGraph
from treeflash.sampling import derive
from spec_helpers import make_drafter, make_target

_g = torch.Generator().manual_seed(7)
# Lengths 5..30 beside one of 45: with 8-token chunks the long one takes 6 steps among short newcomers.
PROMPTS = [torch.randint(1, 62, (n,), generator=_g).tolist() for n in (5, 45, 12, 3, 30, 9, 1)]
CHUNK = 8


def first_tokens(sp: Speculator, slots, prompt_lens, params, seeds, logits: torch.Tensor) -> torch.Tensor:
    """The reference first-token draw, eagerly after a prefill forward (as admission drew it before the draw
    moved into `Speculator.prefill_and_start`): write the requests' sampling rows, draw each first token from
    the logits after its prompt [k, V] at position len(prompt), make it the slot's bonus. Returns them [k]."""
    rows = sp.set_sampling_many(slots, params, seeds)
    first = derive(logits[:, None], rows, torch.tensor(prompt_lens)[:, None])[:, 0]
    sp.state.bonus[torch.tensor(slots)] = first
    return first


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("batched_prefill")
    target = make_target(root / "target", vocab=64)
    return target, make_drafter(root / "drafter", target, 4)


def test_one_forward_over_several_slots_matches_one_slot_at_a_time(paths):
    target = load_target(paths[0], "cpu", torch.float32)[0]
    drafter = load_drafter(paths[1], "cpu", torch.float32)

    def speculator():
        sp = Speculator(target, drafter, SpecConfig("ddtree", 8), slots=8, capacity=96, time_stages=False)
        sp.prefill_many([PrefillPiece(6, PROMPTS[1], 0, 16)])  # the long prompt's first two chunks are in
        return sp

    # Pieces of different lengths in scattered slots, one of them a later chunk (start 16).
    pieces = [PrefillPiece(s, p, 16 if s == 6 else 0, len(p)) for s, p in zip((3, 6, 0, 7, 1), PROMPTS[:5])]
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.7, top_k=5),
              SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_p=0.9)]
    batched, alone = speculator(), speculator()
    logits = batched.prefill_many(pieces)
    reference = torch.stack([alone.prefill_many([p])[0] for p in pieces])
    torch.testing.assert_close(logits, reference, rtol=0, atol=1e-5)

    slots, lens = [p.slot for p in pieces], [len(p.prompt) for p in pieces]
    first = first_tokens(batched, slots, lens, params, list(range(5)), logits)
    first_alone = [first_tokens(alone, [s], [n], [q], [i], reference[i:i + 1])
                   for i, (s, n, q) in enumerate(zip(slots, lens, params))]
    assert first.tolist() == torch.cat(first_alone).tolist()
    assert batched.state.bonus.tolist() == alone.state.bonus.tolist()
    assert batched.state.seq_lens.tolist() == alone.state.seq_lens.tolist()
    assert batched.state.active.tolist() == alone.state.active.tolist()
    for cache_a, cache_b in ((batched.cache, alone.cache), (batched.draft_cache, alone.draft_cache)):
        for a, b in zip(cache_a.keys + cache_a.values, cache_b.keys + cache_b.values):
            for slot, n in zip(slots, lens):
                torch.testing.assert_close(a[slot, :, :n], b[slot, :, :n], rtol=0, atol=1e-5)
                assert not a[slot, :, n:].any()  # padding wrote nothing past a slot's prompt
            assert not a[[2, 4, 5]].any()  # nor into slots outside the batch


def test_prefill_and_start_draws_what_admission_drew_after_the_forward(paths):
    """The device-side admission (forward, commit, first-token draw: what a prefill graph replays) gives the
    first tokens, bonus, lengths and active flags of prefill_many + the reference draw; an unfinished piece (a
    prompt's first chunk) is committed but neither activated nor given a bonus; padded pieces change nothing."""
    target = load_target(paths[0], "cpu", torch.float32)[0]
    drafter = load_drafter(paths[1], "cpu", torch.float32)
    pieces = [PrefillPiece(3, PROMPTS[0], 0, 5), PrefillPiece(6, PROMPTS[1], 0, 16), PrefillPiece(0, PROMPTS[2], 0, 12)]
    params = [SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0),
              SamplingParams(temperature=0.7, top_k=5)]
    done = [i for i, p in enumerate(pieces) if p.end == len(p.prompt)]
    assert done == [0, 2]
    device_side, reference = (Speculator(target, drafter, SpecConfig("ddtree", 8), slots=8, capacity=96,
                                         time_stages=False) for _ in range(2))
    for sp in (device_side, reference):
        sp.state.bonus.fill_(-7)  # (a bonus left from the slot's last request)
    logits = reference.prefill_many(pieces)
    want = first_tokens(reference, [pieces[i].slot for i in done], [len(pieces[i].prompt) for i in done],
                       [params[i] for i in done], [40 + i for i in done], logits[done])
    device_side.set_sampling_many([pieces[i].slot for i in done], [params[i] for i in done], [40 + i for i in done])
    # Padded as a graph would run them: 4 pieces of 16 tokens (the fourth repeats the first), rows up to 32.
    out = torch.full((4, 1), -1, dtype=torch.long)  # the runner's buffer outside its graphs' pool
    drawn = device_side.prefill_and_start(device_side.prefill_batch(pieces, 4, 16), 32, out=out)
    assert drawn.data_ptr() == out.data_ptr()
    assert drawn[done, 0].tolist() == want.tolist()
    assert device_side.state.bonus.tolist() == reference.state.bonus.tolist()
    assert device_side.state.bonus[6].item() == -7  # the unfinished piece's slot keeps its bonus
    assert device_side.state.seq_lens.tolist() == reference.state.seq_lens.tolist()
    assert device_side.state.active.tolist() == reference.state.active.tolist()
    assert device_side.state.active[[3, 0]].all() and not device_side.state.active[6]


def test_prefill_many_rejects_empty_or_repeated_slots(paths):
    target = load_target(paths[0], "cpu", torch.float32)[0]
    sp = Speculator(target, None, SpecConfig(), slots=2, capacity=32, time_stages=False)
    with pytest.raises(ValueError):
        sp.prefill_many([PrefillPiece(0, [1, 2], 0, 2), PrefillPiece(0, [3], 0, 1)])
    with pytest.raises(ValueError):
        sp.prefill_many([PrefillPiece(0, [1, 2], 2, 2)])


def _llm(paths, spec: str, budget: int | None, slots: int = 8) -> LLM:
    target, drafter = paths
    llm = LLM(str(target), device="cpu", draft_model=str(drafter) if spec != "none" else None, spec=spec,
              tree_budget=8, max_num_seqs=slots, prefill_tokens_per_step=budget)
    llm.engine.config = dataclasses.replace(llm.engine.config, prefill_chunk=CHUNK)
    return llm


def _record_forwards(llm: LLM) -> list[list[tuple[int, int]]]:
    forwards, original = [], llm.engine.runner.prefill

    def recording(pieces, prompt_logprobs=False):
        forwards.append([(p.start, p.end) for p in pieces])
        return original(pieces, prompt_logprobs)

    llm.engine.runner.prefill = recording
    return forwards


@pytest.mark.parametrize("spec", ["none", "dflash", "ddtree"])
def test_batched_admission_gives_the_greedy_tokens_of_one_request_at_a_time(paths, spec):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = _llm(paths, "none", None, slots=1)  # one request at a time: no batching anywhere
    solo = [o.token_ids for o in plain.generate(prompt_token_ids=PROMPTS, sampling_params=params)]

    llm = _llm(paths, spec, budget=64)
    forwards = _record_forwards(llm)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    assert [o.token_ids for o in outs] == solo
    assert max(len(f) for f in forwards) > 1  # pieces of several requests shared a forward
    assert all(end - start <= CHUNK for f in forwards for start, end in f)  # the long prompts went in chunks
    assert sum(end - start for f in forwards for start, end in f) == sum(map(len, PROMPTS))


@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_batched_admission_keeps_seeded_sampling(paths, spec):
    params = [SamplingParams(temperature=1.0, top_p=0.95 if i % 2 else 1.0, max_tokens=10, seed=40 + i,
                             ignore_eos=True) for i in range(len(PROMPTS))]
    one_at_a_time = _llm(paths, spec, budget=None)  # the default budget: one chunk, one request per step
    batched = _llm(paths, spec, budget=1000)
    reference = [o.token_ids for o in one_at_a_time.generate(prompt_token_ids=PROMPTS, sampling_params=params)]
    assert [o.token_ids for o in batched.generate(prompt_token_ids=PROMPTS, sampling_params=params)] == reference


def test_a_step_prefills_at_most_its_token_budget(paths):
    llm = _llm(paths, "none", budget=20, slots=4)
    forwards = _record_forwards(llm)
    engine = llm.engine
    for request in llm._requests(None, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), PROMPTS):
        engine.add(request)
    steps = []
    while engine.has_work():
        forwards.clear()
        engine.step()
        steps.append(sum(end - start for f in forwards for start, end in f))
    assert max(steps) <= 20 and steps[0] == 13  # 5 tokens and a chunk of 8; a third chunk of 8 would pass 20


def test_the_prefill_budget_is_checked():
    with pytest.raises(ValueError, match="prefill_tokens_per_step"):
        EngineConfig(prefill_tokens_per_step=0)
    with pytest.raises(ValueError, match="prefill_chunk"):
        EngineConfig(prefill_chunk=True)
    assert EngineConfig().prefill_budget == EngineConfig().prefill_chunk


def test_admitting_in_batches_waits_for_free_slots_and_keeps_the_tokens(paths):
    # Staggered lengths: requests end at different steps, as real responses end at EOS.
    prompts = PROMPTS * 3
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.0, top_p=0.9, max_tokens=3 + (5 * i) % 11, seed=i,
                             ignore_eos=True) for i in range(len(prompts))]
    reference = [o.token_ids for o in _llm(paths, "none", budget=1000, slots=4)
                 .generate(prompt_token_ids=prompts, sampling_params=params)]

    llm = _llm(paths, "none", budget=1000, slots=4)
    llm.engine.config = dataclasses.replace(llm.engine.config, admit_batch=3)
    engine = llm.engine
    requests = llm._requests(None, params, prompts)
    for request in requests:
        engine.add(request)
    held_back = 0
    while engine.has_work():
        free, waiting = len(engine.free), len(engine.waiting)
        engine.step()
        admitted = waiting - len(engine.waiting)
        if free < min(3, waiting) and free < 4:
            assert admitted == 0  # fewer than admit_batch slots free: newcomers wait
            held_back += free > 0
        else:
            assert admitted == min(free, waiting)  # all that fit go in together
    assert held_back  # the rule did hold someone back
    assert [r.output_ids for r in requests] == reference
    assert len(engine.free) == 4 and not engine.speculator.state.active.any()


def test_admit_batch_is_checked():
    with pytest.raises(ValueError, match="admit_batch"):
        EngineConfig(admit_batch=0)


class _EagerGraph:
    """Stands in for a captured prefill graph on the CPU: a replay runs the same forward, commit and draw on
    the same static inputs and writes the same output buffer. A graph holds the sampling flags it was
    captured with, so a replay under other flags would draw wrongly: the runner must key graphs by them."""

    def __init__(self, sp: Speculator, inputs, kv_len: int, first: torch.Tensor, replays: list):
        self.sp, self.inputs, self.kv_len, self.first, self.replays = sp, inputs, kv_len, first, replays
        self.flags = sp.flags

    def replay(self) -> None:
        assert self.sp.flags == self.flags, "a prefill graph replayed under other sampling flags"
        self.replays.append(tuple(self.inputs.tokens.shape) + (self.kv_len,))
        with torch.inference_mode():
            self.first.copy_(self.sp.prefill_and_start(self.inputs, self.kv_len))


def _graph_prefill(llm: LLM) -> list:
    """Route the engine's prefill through GraphRunner.prefill's graph path (padded shapes, static
    inputs, padding stored past each slot's length, first tokens drawn in the graph), with eager
    stand-ins for the graphs."""
    runner, sp, replays = llm.engine.runner, llm.engine.speculator, []

    def capture(inputs, shape):
        first = sp.prefill_and_start(inputs, shape[2])
        return PrefillGraph(_EagerGraph(sp, inputs, shape[2], first, replays), inputs, first)

    runner.enabled = True
    runner._capture_prefill = capture
    runner.round = lambda num_slots, budget=None, kv_rows=None: sp.round(num_slots, budget, kv_rows=kv_rows)  # eager
    return replays


@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_graph_prefill_shapes_give_the_tokens_of_exact_prefill(paths, spec):
    # What a GPU replays: pieces padded to powers of two in count, length (>= 16) and cache rows
    # attended, padding stored at rows past each slot's length. Greedy and seeded outputs must not move.
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    seeded = [SamplingParams(temperature=1.0, top_k=20 if i % 2 else -1, max_tokens=10, seed=70 + i, ignore_eos=True)
              for i in range(len(PROMPTS))]
    # (and with log-probs: the first token's come out of the prefill graph, packed beside its draw)
    with_logprobs = [dataclasses.replace(p, logprobs=3) for p in seeded]
    for params in (greedy, seeded, with_logprobs):
        def run(llm):
            outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
            return [o.token_ids for o in outs], [o.logprobs for o in outs]

        reference = run(_llm(paths, spec, budget=64))
        llm = _llm(paths, spec, budget=64)
        replays = _graph_prefill(llm)
        got = run(llm)
        assert got[0] == reference[0]
        if params is with_logprobs:
            for a, b in zip(got[1], reference[1]):
                assert len(a) == len(b) and all(x.keys() == y.keys() for x, y in zip(a, b))
                assert all(abs(x[t].logprob - y[t].logprob) < 1e-5 for x, y in zip(a, b) for t in x)
        assert replays and all(t == 16 and k & (k - 1) == 0 and kv & (kv - 1) == 0 for k, t, kv in replays)
        assert any(kv > 16 for _, _, kv in replays)  # a later chunk of the long prompts (start > 0) went too


def test_prefill_graph_shapes_round_up_and_stay_inside_the_cache(paths, monkeypatch):
    target = load_target(paths[0], "cpu", torch.float32)[0]
    sp = Speculator(target, None, SpecConfig(), slots=8, capacity=96, time_stages=False)
    sp.capacity = 96  # (the CPU's SDPA rounds it to a whole 512-key block; these shapes are a GPU's)
    runner = GraphRunner(sp, enabled=False)
    prompt = list(range(1, 80))
    # 3 pieces of up to 20 tokens, one starting at 16: 4 x 32, rows attended up to the next power of two.
    pieces = [PrefillPiece(0, prompt, 0, 5), PrefillPiece(1, prompt, 16, 36), PrefillPiece(2, prompt, 0, 9)]
    assert runner.prefill_shape(pieces) == (4, 32, 64)
    assert runner.prefill_shape(pieces[:1]) == (1, 16, 16)  # at least 16 tokens
    # Padding would write past row 96: eager.
    assert runner.prefill_shape([PrefillPiece(0, list(range(1, 95)), 85, 94)]) is None
    # Rows attended never exceed the capacity (80 + 16 = 96 rows, not 128).
    assert runner.prefill_shape([PrefillPiece(0, list(range(1, 90)), 80, 89)]) == (1, 16, 96)
    # Too many elements for one graph: eager.
    monkeypatch.setattr("treeflash.runner.PREFILL_GRAPH_ELEMENTS", 4 * 32 * target.config.hidden_size - 1)
    assert runner.prefill_shape(pieces) is None

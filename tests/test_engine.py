"""The long-lived engine: built once per LLM, reused by every call, growing its caches on demand,
and able to abort a request (waiting or running) so its slot is free at once."""

from __future__ import annotations

import json

import pytest

from treeflash import LLM, SamplingParams
from helpers import make_tiny_target
from spec_helpers import make_drafter, make_target

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [[3, 5, 7, 11], [2, 4, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    target = make_target(root / "target", vocab=64)
    return target, make_drafter(root / "drafter", target, 4)


@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_one_engine_serves_every_call_with_the_same_tokens(pair, spec):
    target, drafter = pair
    llm = LLM(str(target), device="cpu", draft_model=str(drafter) if spec != "none" else None, spec=spec,
              tree_budget=8, max_num_seqs=2)
    engine, cache = llm.engine, llm.engine.speculator.cache
    first = [o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)]
    again = [o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS[::-1], sampling_params=GREEDY)][::-1]
    assert first == again
    assert llm.engine is engine and llm.engine.speculator.cache is cache  # nothing rebuilt between calls
    assert not engine.has_work() and all(s is None for s in engine.slots)


def capacities_reserved(sp) -> list[int]:
    """The capacity after every `reserve` call from now on (an idle engine's caches shrink back after)."""
    seen, reserve = [], sp.reserve

    def recorded(capacity):
        reserve(capacity)
        seen.append(sp.capacity)

    sp.reserve = recorded
    return seen


def test_caches_grow_for_a_long_request_and_keep_running_slots(pair):
    target, drafter = pair
    llm = LLM(str(target), device="cpu", draft_model=str(drafter), tree_budget=8, max_num_seqs=2)
    short = llm.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=GREEDY)[0].token_ids
    start, grown = llm.engine.speculator.capacity, capacities_reserved(llm.engine.speculator)
    long = SamplingParams(temperature=0, max_tokens=700, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=[PROMPTS[0], PROMPTS[1]], sampling_params=[GREEDY, long])
    assert max(grown) > start  # (and back to `start` once idle)
    assert outs[0].token_ids == short
    plain = LLM(str(target), device="cpu", max_num_seqs=1).generate(prompt_token_ids=[PROMPTS[1]],
                                                                      sampling_params=long)[0].token_ids
    assert outs[1].token_ids == plain


def test_abort_frees_the_slot_of_a_running_and_drops_a_waiting_request(pair):
    target, _ = pair
    llm = LLM(str(target), device="cpu", max_num_seqs=1)
    engine = llm.engine
    running, waiting = llm._requests(None, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True),
                                     PROMPTS[:2])
    engine.add(running)
    engine.add(waiting)
    engine.step()
    assert engine.slots[0] is running and list(engine.waiting) == [waiting]
    assert engine.abort(waiting.id) and waiting.finish_reason == "abort" and not engine.waiting
    assert engine.abort(running.id) and running.finish_reason == "abort"
    assert engine.slots == [None] and not engine.has_work()
    assert not engine.abort(running.id)  # already gone
    assert int(engine.speculator.state.active.sum()) == 0
    # The freed slot serves the next request exactly.
    again = llm.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=GREEDY)[0].token_ids
    fresh = LLM(str(target), device="cpu").generate(prompt_token_ids=[PROMPTS[0]], sampling_params=GREEDY)
    assert again == fresh[0].token_ids


def test_a_stream_closed_early_gives_its_slot_back(tmp_path):
    target = make_tiny_target(tmp_path / "chars", tokenizer=True)  # text, so chunks come before the end
    llm = LLM(str(target), device="cpu", max_num_seqs=1)
    stream = llm.stream("abc",
                        sampling_params=SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    next(stream)
    assert llm.engine.slots[0] is not None
    stream.close()
    assert llm.engine.slots == [None] and not llm.engine.has_work()


def test_an_interrupted_generate_leaves_the_engine_clean(pair, monkeypatch):
    target, _ = pair
    llm = LLM(str(target), device="cpu", max_num_seqs=2)
    calls = {"n": 0}
    step = llm.engine.step

    def interrupted_step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return step()

    monkeypatch.setattr(llm.engine, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    assert not llm.engine.has_work()
    monkeypatch.setattr(llm.engine, "step", step)
    assert len(llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)) == 3


@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_a_long_prompt_is_prefilled_one_chunk_per_step_beside_running_requests(pair, spec, monkeypatch):
    """A newcomer's prompt goes in a chunk per step while rounds go on; a slot mid-prefill sits inside
    the running batch (rounds write past its rows) and still gives the newcomer its solo output."""
    import dataclasses

    target, drafter = pair

    def llm(chunk=None):
        made = LLM(str(target), device="cpu", draft_model=str(drafter) if spec != "none" else None, spec=spec,
                   tree_budget=8, max_num_seqs=2)
        if chunk:
            made.engine.config = dataclasses.replace(made.engine.config, prefill_chunk=chunk)
        return made

    long_prompt = [(7 * i) % 60 + 1 for i in range(45)]  # 6 chunks of 8 (the last one 5 tokens)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    solo = [llm().generate(prompt_token_ids=[p], sampling_params=params)[0].token_ids  # prompts in one piece
            for p in (PROMPTS[0], long_prompt)]

    server = llm(chunk=8)
    engine = server.engine
    prefilled = []
    original = engine.runner.prefill

    def counting_prefill(pieces, prompt_logprobs=False):
        prefilled.extend(p.end - p.start for p in pieces)
        return original(pieces, prompt_logprobs)

    monkeypatch.setattr(engine.runner, "prefill", counting_prefill)
    short, running, newcomer = server._requests(
        None, [SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), params, params],
        [PROMPTS[1], PROMPTS[0], long_prompt])
    engine.add(short)
    engine.add(running)
    while not short.finished:
        engine.step()
    assert short.slot is None and running.slot == 1  # slot 0 is free, below a running slot
    engine.add(newcomer)
    steps_while_prefilling = 0
    while not newcomer.running and not newcomer.finished:
        prefilled.clear()
        before = len(running.output_ids)
        engine.step()
        steps_while_prefilling += 1
        assert newcomer.slot == 0 and sum(prefilled) <= 8
        assert running.finished or len(running.output_ids) > before  # the running request kept going
    assert steps_while_prefilling == 6
    while engine.has_work():
        engine.step()
    assert [running.output_ids, newcomer.output_ids] == solo


def test_a_prompt_prefilling_in_a_slot_above_the_running_ones(pair):
    """Seeded sampling (per-slot sampling rows) with the slot mid-prefill past the last running slot."""
    import dataclasses

    target, _ = pair
    long_prompt = [(5 * i) % 60 + 1 for i in range(30)]
    params = [SamplingParams(temperature=1.0, max_tokens=20, seed=s, ignore_eos=True) for s in (3, 4)]
    solo = [LLM(str(target), device="cpu").generate(prompt_token_ids=[p], sampling_params=q)[0].token_ids
            for p, q in zip((PROMPTS[0], long_prompt), params)]
    llm = LLM(str(target), device="cpu", max_num_seqs=2)
    llm.engine.config = dataclasses.replace(llm.engine.config, prefill_chunk=8)
    outs = llm.generate(prompt_token_ids=[PROMPTS[0], long_prompt], sampling_params=params)
    assert [o.token_ids for o in outs] == solo


def test_capture_graphs_takes_every_bucket_up_to_the_batch_with_its_flags(pair):
    # The CPU never captures (capture_graphs returns 0); the bucket walk and the borrowed flags are
    # checked with a runner that records instead of capturing.
    target, _ = pair
    llm = LLM(str(target), device="cpu", max_num_seqs=8, cuda_graph_sizes=[1, 2, 4, 8])
    engine = llm.engine
    assert engine.capture_graphs(8, GREEDY) == 0
    seen = []
    engine.runner.enabled = True
    engine.runner.graph = lambda bucket, budget: seen.append((bucket, engine.speculator.flags.all_greedy))
    prefills = []
    engine.runner.prefill = lambda pieces: prefills.append([(p.slot, p.start, p.end) for p in pieces])
    sampled = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=4)
    # A free slot past the buckets captured that holds a prompt's rows (its length kept at them): the capture
    # writes idle slots from row 0, so nothing is held after it, and every slot's length is 0 again.
    engine.prefixes.hold(6, list(range(1100)), 1024)
    engine.seq_lens[6] = engine.speculator.state.seq_lens[6] = engine.prefixes.rows(6)
    engine.capture_graphs(3, sampled)
    assert engine.prefixes.rows_held() == 0 and engine.seq_lens == [0] * 8
    assert seen == [(1, False), (2, False), (4, False)]  # 3 runs in the 4-bucket's graph
    # 1, 2 and 4 prompts (up to the 4-bucket) of each power-of-two length that fits the cache (512 rows on the
    # CPU: one block of its attention kernel), one step's prefill (512 tokens) and a graph's element bound,
    # in slots 0, 1, ...
    assert prefills == [[(slot, 0, n) for slot in range(count)] for count, lengths in
                        ((1, (16, 32, 64, 128, 256, 512)), (2, (16, 32, 64, 128, 256)), (4, (16, 32, 64, 128)))
                        for n in lengths]
    assert engine.speculator.state.seq_lens.tolist() == [0] * 8 and not engine.speculator.state.active.any()
    assert engine.speculator.flags.all_greedy and all(p is None for p in engine.speculator.slot_params)
    # tree_budget="auto": each bucket's cost profile is measured (its graphs captured) up front, and every
    # budget weighed there is captured under these flags too (a stored profile measured nothing here).
    auto = LLM(str(target), device="cpu", draft_model=str(pair[1]), max_num_seqs=8, cuda_graph_sizes=[1, 2, 4, 8]).engine
    measured, captured = [], []
    auto.runner.enabled = True
    auto.runner.prefill = lambda pieces: None
    flags = lambda: auto.speculator.flags.all_greedy  # noqa: E731
    auto.budget.costs = lambda bucket: measured.append((bucket, flags())) or {0: 1.0, 4: 2.0}
    auto.runner.graph = lambda bucket, budget: captured.append((bucket, budget, flags()))
    auto.capture_graphs(2, sampled)
    assert measured == [(1, False), (2, False)]
    assert captured == [(1, 0, False), (1, 4, False), (2, 0, False), (2, 4, False)]
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        LLM(str(target), device="cpu", max_num_seqs=8, cuda_graph_sizes=[16])


def test_the_tree_builder_setting_reaches_the_round(pair):
    # (On the CPU the Triton builder never runs: round.use_tree_kernel; the setting still travels.)
    target, drafter = pair
    for setting in (None, True, False):
        llm = LLM(str(target), device="cpu", draft_model=str(drafter), tree_budget=8, tree_kernel=setting)
        assert llm.engine.speculator.tree_kernel is setting


def test_eager_caches_grow_as_requests_get_long_not_to_their_max_tokens(tmp_path):
    # On the CPU a request asking for up to 1,500 tokens takes no rows for them until it writes them (a chat
    # request without max_tokens would otherwise take every slot's caches to the whole context); the caches
    # grow between rounds as it goes, and its tokens are those of caches that held everything from the start.
    target = make_target(tmp_path / "target", vocab=64)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    drafter = make_drafter(tmp_path / "drafter", target, 4)
    params = SamplingParams(temperature=0, max_tokens=1500, ignore_eos=True)
    llm = LLM(str(target), device="cpu", draft_model=str(drafter), max_model_len=2048)
    sp = llm.engine.speculator
    start = sp.capacity
    request = llm._requests(None, params, [PROMPTS[0]])[0]
    llm.engine.add(request)
    for _ in range(4):  # admission (prefill) and three rounds
        llm.engine.step()
    assert len(request.output_ids) > 3 and sp.capacity == start < 1500
    assert llm.engine.abort(request.id)
    reserved = capacities_reserved(sp)
    grown = llm.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=SamplingParams(
        temperature=0, max_tokens=700, ignore_eos=True))[0].token_ids
    assert start < max(reserved) < llm.engine.max_capacity and sp.capacity == start
    held = LLM(str(target), device="cpu", draft_model=str(drafter), max_model_len=2048)
    held.engine.reserve_all()
    assert held.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=SamplingParams(
        temperature=0, max_tokens=700, ignore_eos=True))[0].token_ids == grown


def test_idle_eager_caches_shrink_back_to_their_first_size(tmp_path):
    # A long request grows the caches (GBs on the CPU for one that ran to the context); once nothing runs they
    # shrink, and later requests decode as on caches that never grew. reserve_all's size, asked for, stays.
    target = make_target(tmp_path / "target", vocab=64)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    drafter = make_drafter(tmp_path / "drafter", target, 4)
    llm = LLM(str(target), device="cpu", draft_model=str(drafter), max_model_len=1200)
    engine, sp = llm.engine, llm.engine.speculator
    start = sp.capacity

    def tokens(prompts, max_tokens):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        return [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]

    short = tokens(PROMPTS[:2], 8)
    long_request = llm._requests(None, SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True),
                                 [PROMPTS[0]])[0]
    engine.add(long_request)
    while len(long_request.output_ids) < 700:
        engine.step()
    assert sp.capacity > start and sp.draft_cache.capacity == sp.capacity
    assert engine.abort(long_request.id)  # the last request: the caches shrink at once
    assert sp.capacity == sp.cache.capacity == sp.draft_cache.capacity == start
    assert tokens(PROMPTS[:2], 8) == short
    grown = tokens([PROMPTS[1]], 600)
    assert sp.capacity == start  # (grew while it ran, shrank after)
    assert engine.reserve_all() and sp.capacity == engine.max_capacity
    assert tokens([PROMPTS[1]], 600) == grown and sp.capacity == engine.max_capacity


def test_reserve_all_grows_the_caches_to_the_longest_request_where_memory_allows(pair):
    target, drafter = pair
    engine = LLM(str(target), device="cpu", draft_model=str(drafter), max_model_len=500).engine
    sp = engine.speculator
    before = sp.capacity
    assert before < engine.max_capacity
    per_row = (sp.cache.nbytes + sp.draft_cache.nbytes) / before
    # Too little free memory for the new rows: nothing grows.
    assert not engine.reserve_all(free_bytes=int(per_row * (engine.max_capacity - before)))
    assert sp.capacity == before
    assert engine.reserve_all(free_bytes=int(3 * per_row * (engine.max_capacity - before)))
    assert sp.capacity == engine.max_capacity and sp.draft_cache.capacity == engine.max_capacity
    assert engine.reserve_all(free_bytes=0)  # (already there)
    # A request of the longest kind then needs no growth: the same tokens as an engine that grew on demand.
    params = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)
    grown = LLM(str(target), device="cpu", draft_model=str(drafter), max_model_len=500)
    want = grown.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=params)[0].token_ids
    llm = LLM(str(target), device="cpu", draft_model=str(drafter), max_model_len=500)
    llm.engine.reserve_all()
    capacity = llm.engine.speculator.capacity
    assert llm.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=params)[0].token_ids == want
    assert llm.engine.speculator.capacity == capacity

"""Prefix reuse (treeflash/prefix_reuse.py): a prompt's whole prefill chunks that a slot's caches hold from
an earlier prompt are taken, not prefilled again, and nothing else changes: on the CPU in float32 every token
and log-prob equals the engine's with reuse off, bit for bit, for plain decoding and DDTree, across slots,
after other requests ran, and after rounds ran over the holding slot while it was free (which write past
the rows it holds)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import make_tiny_target
from spec_helpers import make_drafter
from treeflash import LLM, SamplingParams
from treeflash.prefix_reuse import PrefixReuse

CHUNK = 8


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("prefix-reuse")
    target = make_tiny_target(path / "target", tokenizer=True, max_position_embeddings=512)
    return target, make_drafter(path / "drafter", target, block_size=4)


def _llm(pair, spec: str, reuse: bool, **kw) -> LLM:
    target, drafter = pair
    llm = LLM(str(target), device="cpu", draft_model=str(drafter) if spec != "none" else None, spec=spec,
              tree_budget=8 if spec == "ddtree" else "auto", max_num_seqs=4, **kw)
    llm.engine.config = dataclasses.replace(llm.engine.config, prefill_chunk=CHUNK, prefix_reuse=reuse)
    return llm


def _params(n: int = 12, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, logprobs=2, ignore_eos=True, **kw)


def _same(got, want):
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    # (the drafter's rows and prompt lookup's tokens are reused too: the same drafts, so the same acceptance)
    assert [o.metrics.acceptance_lengths for o in got] == [o.metrics.acceptance_lengths for o in want]
    assert [[{t: e.logprob for t, e in entry.items()} for entry in o.logprobs] for o in got] == \
        [[{t: e.logprob for t, e in entry.items()} for entry in o.logprobs] for o in want]


BASE = "the quick brown fox jumps over the lazy dog and then "  # 53 characters: 6 whole chunks of 8
TURNS = [BASE + "runs", BASE + "runs away fast", BASE + "sleeps", "another prompt entirely, no common start",
         BASE[:20] + "xyz", BASE + "runs away fast and far"]


@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_reused_prefixes_change_no_bit_one_request_at_a_time(pair, spec):
    on, off = _llm(pair, spec, True), _llm(pair, spec, False)
    cached = []
    for prompt in TURNS:
        got, want = on.generate([prompt], _params(), use_tqdm=False), off.generate([prompt], _params(),
                                                                                       use_tqdm=False)
        _same(got, want)
        cached.append(got[0].num_cached_tokens)
        assert want[0].num_cached_tokens == 0
    # Each prompt's whole chunks before its last token that the last one prefilled (one request at a time runs
    # in slot 0, so a prompt's prefill replaces the chunks held before): 7 of the 8 of BASE + "runs away fast",
    # 6 of BASE + "sleeps", none after the other prompt, 2 of BASE[:20] + "xyz".
    assert cached == [0, 56, 48, 0, 0, 16]
    assert on.engine.stats.reused_prompt_tokens == sum(cached)
    assert on.engine.stats.prefill_tokens == off.engine.stats.prefill_tokens - sum(cached)


def _same_rows(a, b, slot: int, rows: int) -> None:
    """Slot `slot`'s first `rows` rows are bit for bit equal in the two speculators: the target's and the
    drafter's keys and values, and prompt lookup's tokens."""
    for x, y in ((a.cache, b.cache), (a.draft_cache, b.draft_cache)):
        assert all(torch.equal(s[:, slot, :, :rows], t[:, slot, :, :rows]) for s, t in zip(x.stacked, y.stacked))
    assert torch.equal(a.history[slot, :rows], b.history[slot, :rows])


def test_reuse_across_slots_and_from_a_free_slot_rounds_ran_over(pair):
    on, off = _llm(pair, "ddtree", True), _llm(pair, "ddtree", False)
    short_long = [_params(4), _params(30)]  # (the request in slot 0 ends rounds before the one in slot 1)

    def both(prompts, params, compare):
        got = on.generate(prompts, params, use_tqdm=False)
        _same(got, off.generate(prompts, params, use_tqdm=False))
        held = [h and h.chunks for h in on.engine.prefixes.held]
        # What slot `compare` holds (one that no round ran over after its request: the engine without reuse
        # writes a free slot's rows from row 0) is what the engine without reuse, slots taken in the same
        # order, has there.
        _same_rows(on.engine.speculator, off.engine.speculator, compare, held[compare] * CHUNK)
        return [o.num_cached_tokens for o in got], held

    # Slot 0 ends first, and the rounds of slot 1 that follow run over it free, writing past the rows it holds.
    assert both([BASE + "runs", "zz " + BASE], short_long, compare=1) == ([0, 0], [7, 7, None, None])
    alone = _llm(pair, "ddtree", False)  # (slot 0 without the rounds that ran over it)
    alone.generate([BASE + "runs"], short_long[0], use_tqdm=False)
    _same_rows(on.engine.speculator, alone.engine.speculator, 0, 7 * CHUNK)
    # so a prompt beginning the same way takes them, in the same slot
    assert both([BASE + "runs far"], _params(), compare=0) == ([56], [7, 7, None, None])
    # The first prompt takes slot 0 and copies the 7 chunks of "zz " + BASE from slot 1 (then prefills its
    # eighth); the second none. Slot 0 ends holding 64 rows, more than slot 1's request then has: emptied.
    assert both(["zz " + BASE + "at night", BASE + "swims"], short_long, compare=1) == ([56, 0], [None, 7, None, None])
    # BASE's 6 whole chunks (53 characters), from what slot 1 holds now (BASE + "swims"), into slot 0, whose
    # prefill then adds its prompt's seventh.
    assert both([BASE + "at dawn"], _params(), compare=0) == ([48], [7, 7, None, None])
    # A free slot holding more rows than the longest running request has is emptied (rounds would attend over
    # them): slot 0's 13 chunks, while slot 1 runs a 10-token prompt.
    assert both([BASE + BASE + "on", "short one"], short_long, compare=1) == ([48, 0], [None, 1, None, None])


def test_prompt_logprobs_requests_prefill_everything(pair):
    on, off = _llm(pair, "ddtree", True), _llm(pair, "ddtree", False)
    on.generate([BASE + "runs"], _params(), use_tqdm=False)
    params = _params(4, prompt_logprobs=1)
    got, want = on.generate([BASE + "runs"], params, use_tqdm=False), off.generate([BASE + "runs"], params,
                                                                                      use_tqdm=False)
    assert got[0].num_cached_tokens == 0 and got[0].prompt_logprobs == want[0].prompt_logprobs
    # its prefill leaves the chunks for the next request all the same
    assert on.generate([BASE + "sits"], _params(), use_tqdm=False)[0].num_cached_tokens == 48
    # and for one admitted with it, which waits for them; never the other way round
    for prompts, cached in ((["zz" + BASE + "runs", "zz" + BASE + "sits"], [0, 48]),
                            (["yy" + BASE + "sits", "yy" + BASE + "runs"], [0, 0])):
        both = [params, _params()] if cached[1] else [_params(), params]
        got, want = on.generate(prompts, both, use_tqdm=False), off.generate(prompts, both, use_tqdm=False)
        assert [o.num_cached_tokens for o in got] == cached
        assert [o.prompt_logprobs for o in got] == [o.prompt_logprobs for o in want]
        for a, b in zip(got, want):
            _same(a.outputs, b.outputs)


def test_prefix_index_bookkeeping():
    index = PrefixReuse(slots=3, chunk=4)
    prompt = list(range(20))
    assert index.find(prompt) == (None, 0)
    index.hold(0, prompt, 4)
    index.grow(0, 11)  # two whole chunks prefilled
    assert index.find(prompt) == (0, 8) and index.find(prompt[:9]) == (0, 8) and index.find(prompt[:8]) == (0, 4)
    assert index.find([99] + prompt) == (None, 0)
    index.hold(2, prompt, 16)
    assert index.find(prompt) == (2, 16) and index.find(prompt[:10], prefer=2) == (2, 8)
    assert index.find(prompt[:10]) == (0, 8) and index.rows_held() == 16
    index.forget([2])
    assert index.find(prompt) == (0, 8)
    index.hold(0, [7] * 20, 8)  # the slot taken by another prompt
    assert index.find(prompt) == (None, 0) and index.find([7] * 20) == (0, 8)
    index.forget_all()
    assert index.find([7] * 20) == (None, 0) and index.rows_held() == 0


@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_prompts_of_one_step_prefill_a_shared_chunk_once(pair, spec):
    """Prompts admitted together that begin the same way (a batch under one system prompt, n > 1) prefill each
    shared chunk once: the others wait a step and take it from that slot, and nothing else changes."""
    on, off = _llm(pair, spec, True), _llm(pair, spec, False)
    prompts = [BASE + "runs", BASE + "sleeps", "zz " + BASE, BASE + "runs"]
    params = [_params(), _params(seed=1), _params(), dataclasses.replace(_params(), n=2)]
    got = on.generate(prompts, params, use_tqdm=False)
    want = off.generate(prompts, params, use_tqdm=False)
    for a, b in zip(got, want):
        _same(a.outputs, b.outputs)
    assert [len(o.outputs) for o in got] == [1, 1, 1, 2]
    # BASE + "runs" (57 characters) is 7 whole chunks; BASE + "sleeps" shares 6 with it, the n=2 copies all 7.
    # (max_num_seqs=4: the fifth request, the n=2 prompt's second completion, starts after the others.)
    assert [o.num_cached_tokens for o in got] == [0, 48, 0, 56]
    reused = on.engine.stats.reused_prompt_tokens
    assert reused >= 48 + 56 + 56 and on.engine.stats.prefill_tokens == off.engine.stats.prefill_tokens - reused


def test_a_waiting_prompt_takes_the_chunks_of_one_aborted_meanwhile(pair):
    on, off = _llm(pair, "ddtree", True), _llm(pair, "ddtree", False)
    first, second = (on._requests([prompt], _params(), None)[0] for prompt in (BASE + "runs", BASE + "sleeps"))
    on.engine.add(first)
    on.engine.add(second)
    on.engine.step()  # the first prefills chunk 1; the second waits for it
    assert first.prefilled == CHUNK and second.prefilled == 0 and second.waits_for_copy
    on.engine.abort(first.id)  # its slot is free, and holds chunk 1
    while not second.finished:
        on.engine.step()
    assert second.metrics.num_cached_tokens == CHUNK
    _same([on.engine.output_of(second)], off.generate([BASE + "sleeps"], _params(), use_tqdm=False)[0].outputs)


@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_a_mixed_workload_changes_no_bit(pair, spec):
    """Many requests through 4 slots at once: prompts under three shared beginnings or none, lengths of
    reply that free slots below running ones, n > 1, sampling; every token, log-prob and acceptance equal
    to reuse off, and prompt tokens taken."""
    import random

    rng = random.Random(7)
    starts = [BASE, "zz " + BASE + BASE[:11], BASE[:17], ""]
    prompts = [rng.choice(starts) + "".join(rng.choice("abcdefgh ") for _ in range(rng.randrange(1, 12)))
               for _ in range(14)]
    params = [dataclasses.replace(_params(rng.randrange(1, 24)), n=rng.choice([1, 1, 1, 2]),
                                  **({"temperature": 0.8, "seed": i} if i % 3 == 0 else {}))
              for i in range(len(prompts))]
    on, off = _llm(pair, spec, True), _llm(pair, spec, False)
    got, want = on.generate(prompts, params, use_tqdm=False), off.generate(prompts, params, use_tqdm=False)
    for a, b in zip(got, want):
        _same(a.outputs, b.outputs)
    assert on.engine.stats.reused_prompt_tokens > 0
    assert on.engine.stats.prefill_tokens == off.engine.stats.prefill_tokens - on.engine.stats.reused_prompt_tokens

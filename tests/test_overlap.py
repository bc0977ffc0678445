"""Overlapped rounds (EngineConfig.overlap): each step launches its round before reading the last one
back. On a GPU that hides the host's bookkeeping; here, on the CPU, it is forced on to check that the
bookkeeping is exact: the same tokens, stops, finish reasons and freed slots as rounds read at once, with
requests ending (and their slots reused) while a round for them is already launched."""

from __future__ import annotations

import pytest

from treeflash import LLM, SamplingParams
from treeflash.engine import Engine
from spec_helpers import install_oracle, make_drafter, make_target

PROMPTS = [[5, 9, 2], [11], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], [7, 7, 8, 20, 13, 6, 1], [30, 2, 17, 4, 44],
           [8, 8, 8]]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
          SamplingParams(temperature=0.8, max_tokens=15, seed=7, ignore_eos=True),
          SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
          SamplingParams(temperature=1.0, top_k=10, top_p=0.9, max_tokens=25, seed=11, ignore_eos=True),
          SamplingParams(temperature=0.6, min_p=0.1, max_tokens=12, seed=3, ignore_eos=True),
          SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("overlap")
    target = make_target(root / "target", vocab=64, init_std=0.1, seed=1)
    return target, make_drafter(root / "drafter", target, 8)


@pytest.fixture(params=[True, False], ids=["read-first-near-the-end", "always-overlap"])
def read_first(request, monkeypatch):
    """Also with the step never reading a round first (Engine._may_all_end): every request that ends
    then has a round launched after its last one, whose tokens are thrown away."""
    if not request.param:
        monkeypatch.setattr(Engine, "_may_all_end", lambda self, launched: False)
    return request.param


def run(pair, spec, overlap, params=PARAMS, prompts=PROMPTS, max_num_seqs=3, **options):
    target, drafter = pair
    llm = LLM(str(target), device="cpu", draft_model=str(drafter) if spec != "none" else None,
              spec=spec.split(":")[0], tree_budget=_budget(spec), max_num_seqs=max_num_seqs, overlap=overlap,
              **options)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    return llm, [(o.token_ids, o.finish_reason) for o in outs]


def _budget(spec: str):
    budget = spec.partition(":")[2]
    return "auto" if budget == "auto" else int(budget or 64)


def plain_greedy(pair, prompts, n):
    greedy = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return [t for t, _ in run(pair, "none", False, [greedy] * len(prompts), prompts)[1]]


def test_overlap_is_off_on_the_cpu_unless_asked(pair):
    assert LLM(str(pair[0]), device="cpu").engine.overlap is False
    assert LLM(str(pair[0]), device="cpu", overlap=True).engine.overlap is True


@pytest.mark.parametrize("spec,oracle", [("none", False), ("dflash", False), ("ddtree:16", False),
                                         ("ddtree:auto", False), ("dflash", True), ("ddtree:16", True),
                                         ("ddtree:auto", True)])
def test_overlapped_rounds_give_the_same_tokens(pair, monkeypatch, read_first, spec, oracle):
    """Greedy and seeded requests, more than the slots (slots are reused while a round for their last
    request may still be launched), ending at max_tokens: token for token as rounds read at once."""
    if oracle:  # deep acceptance: requests end inside many-token rounds
        greedy = plain_greedy(pair, PROMPTS, 25)
        install_oracle(monkeypatch, {tuple(p): p + g for p, g in zip(PROMPTS, greedy)}, 64, decoy_rate=0.2)
    _, at_once = run(pair, spec, False)
    llm, overlapped = run(pair, spec, True)
    assert overlapped == at_once
    assert [len(t) for t, _ in overlapped] == [p.max_tokens for p in PARAMS]
    assert not llm.engine.has_work() and all(s is None for s in llm.engine.slots)
    assert not llm.engine.speculator.state.active.any()


@pytest.mark.parametrize("spec", ["none", "ddtree:16"])
def test_stop_tokens_end_requests_as_without_overlap(pair, monkeypatch, read_first, spec):
    """A stop token found when a round is read: the round launched meanwhile for that request is thrown
    away, and its slot goes to the next request."""
    greedy = plain_greedy(pair, PROMPTS, 30)
    if spec != "none":
        install_oracle(monkeypatch, {tuple(p): p + g for p, g in zip(PROMPTS, greedy)}, 64, decoy_rate=0.0)
    params = [SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[g[k]], ignore_eos=True)
              for g, k in zip(greedy, [5, 9, 3, 12, 7, 20])]
    _, at_once = run(pair, spec, False, params, max_num_seqs=2)
    llm, overlapped = run(pair, spec, True, params, max_num_seqs=2)
    assert overlapped == at_once
    assert [r for _, r in overlapped].count("stop") >= 4


def test_stop_strings_and_text_with_overlap(tmp_path, monkeypatch):
    from helpers import make_tiny_target

    target = make_tiny_target(tmp_path / "text-target", "qwen3", vocab_size=64, seed=11, tokenizer=True)
    drafter = make_drafter(tmp_path / "text-drafter", target, 8)
    prompts = ["the quick brown fox", "hello there", "abc"]
    plain = LLM(str(target), device="cpu")
    free = plain.generate(prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), use_tqdm=False)
    install_oracle(monkeypatch, {tuple(o.prompt_token_ids): o.prompt_token_ids + o.token_ids for o in free}, 64,
                   decoy_rate=0.0)
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[o.text[7:9]]) for o in free]
    outs = {}
    for overlap in (False, True):
        llm = LLM(str(target), device="cpu", draft_model=str(drafter), tree_budget=16, max_num_seqs=2,
                  overlap=overlap)
        outs[overlap] = [(o.text, o.token_ids, o.finish_reason) for o in llm.generate(prompts, params,
                                                                                      use_tqdm=False)]
        streamed = "".join(chunk.text for chunk in llm.stream(prompts[0], params[0]))
        assert streamed == outs[overlap][0][0]
    assert outs[True] == outs[False]
    assert all(reason == "stop" for _, _, reason in outs[True])


def test_an_abort_with_a_round_in_flight_frees_the_slot(pair):
    llm = LLM(str(pair[0]), device="cpu", draft_model=str(pair[1]), tree_budget=8, max_num_seqs=1, overlap=True)
    engine = llm.engine
    request, = llm._requests(None, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), [PROMPTS[0]])
    engine.add(request)
    for _ in range(3):
        engine.step()
    assert engine.in_flight is not None and 0 < len(request.output_ids) < 40
    assert engine.abort(request.id) and request.finish_reason == "abort"
    assert engine.slots == [None] and not engine.speculator.state.active.any()
    again = llm.generate(prompt_token_ids=PROMPTS[:2], sampling_params=PARAMS[:2], use_tqdm=False)
    _, ref = run(pair, "ddtree:8", False, PARAMS[:2], PROMPTS[:2], max_num_seqs=1)
    assert [(o.token_ids, o.finish_reason) for o in again] == ref
    assert not engine.has_work()


@pytest.mark.parametrize("spec", ["none", "ddtree:16"])
def test_requests_that_fill_the_context_leave_room_for_the_extra_round(pair, monkeypatch, read_first, spec):
    """The context limit ends requests inside a round; the round launched after it for them writes past
    their last token, into rows the caches reserve for it (the CPU refuses an out-of-range row)."""
    greedy = plain_greedy(pair, PROMPTS, 40)
    if spec != "none":
        install_oracle(monkeypatch, {tuple(p): p + g for p, g in zip(PROMPTS, greedy)}, 64, decoy_rate=0.1)
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    _, at_once = run(pair, spec, False, [params] * 6, max_num_seqs=2, max_model_len=32, time_stages=False)
    llm, overlapped = run(pair, spec, True, [params] * 6, max_num_seqs=2, max_model_len=32, time_stages=False)
    assert overlapped == at_once
    assert [len(t) for t, _ in overlapped] == [32 - len(p) for p in PROMPTS]


def test_no_round_is_wasted_on_requests_that_end_at_max_tokens(pair):
    """At batch 1, a round that may end its request is read before the next one is launched."""
    llm, outs = run(pair, "none", True, [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)] * 2,
                    PROMPTS[:2], max_num_seqs=1)
    assert [len(t) for t, _ in outs] == [20, 20]
    assert llm.engine.stats.rounds == 2 * 19  # the first token comes from prefill


def test_caches_grow_while_a_round_is_in_flight(pair):
    """A long request admitted while another's round is launched: the caches are replaced (and the graphs
    dropped) under a round in flight, and every request keeps its tokens."""
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (10, 40, 300)]
    _, at_once = run(pair, "ddtree:8", False, params, PROMPTS[:3], max_num_seqs=2)
    llm, overlapped = run(pair, "ddtree:8", True, params, PROMPTS[:3], max_num_seqs=2)
    assert overlapped == at_once and [len(t) for t, _ in overlapped] == [10, 40, 300]
    assert llm.engine.speculator.capacity > 256  # (the CPU's starting capacity: it grew)

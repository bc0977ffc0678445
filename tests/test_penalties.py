"""Repetition, frequency and presence penalties: vLLM's rules, exact under speculation.

Each tree node is penalised with its own past (the output so far plus its drafted path), so greedy output
equals plain decoding's with the same penalties (and transformers' for the repetition penalty), and the
joint law of sampled tokens is the penalised one, checked by a chi-square test with teeth."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from treeflash import LLM, SamplingParams
from treeflash.penalties import penalize
from treeflash.round import SpecConfig, Speculator
from treeflash.sampling import SamplingTensors, processed_probs
from treeflash.structured import Grammar
from spec_helpers import chi_square, first_emitted, install_oracle, load_hf, make_drafter, make_target

PROMPTS = [[3, 5, 7, 11, 3, 5], [2, 4, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1]]
PENALTIES = [dict(repetition_penalty=1.5), dict(presence_penalty=1.2, frequency_penalty=0.6),
             dict(repetition_penalty=0.8, frequency_penalty=-0.5, presence_penalty=0.3)]


def reference(logits: torch.Tensor, counts: dict[int, int], prompt: set[int], p: SamplingParams) -> torch.Tensor:
    """vLLM's penalties on one row of logits, token by token."""
    x = logits.double().clone()
    for v in set(counts) | prompt:
        r = p.repetition_penalty
        x[v] = x[v] / r if x[v] > 0 else x[v] * r
    for v, c in counts.items():
        x[v] -= p.frequency_penalty * c + p.presence_penalty * (c > 0)
    return x


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("penalties")
    target = make_target(root / "target", vocab=64, head_scale=4.0)
    return target, make_drafter(root / "drafter", target, 4), load_hf(target)


def _llm(pair, spec, ngram=0, budget=8, **kw):
    extra = {"tree_budget": budget} if spec == "ddtree" else {}
    return LLM(str(pair[0]), device="cpu", draft_model=str(pair[1]) if spec != "none" else None, spec=spec,
               ngram_tokens=ngram, max_num_seqs=2, **extra, **kw)


def _greedy(n=20, **penalties) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **penalties)


def test_penalize_follows_vllms_rules_on_every_nodes_own_path():
    gen = torch.Generator().manual_seed(0)
    s, n, vocab = 2, 5, 12
    logits = torch.randn(s, n, vocab, generator=gen) * 3
    # Node 0 is the root; 1 and 2 its children; 3 under 1; 4 under 3.
    parents = [0, 0, 0, 1, 3]
    tokens = torch.tensor([[4, 7, 4, 7, 9], [1, 2, 3, 2, 2]])
    ancestors = torch.zeros(s, n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while True:
            ancestors[:, i, j] = True
            if j == 0:
                break
            j = parents[j]
    output = torch.zeros(s, vocab, dtype=torch.int32)
    output[0, 4], output[0, 5], output[1, 1] = 2, 1, 1  # (slot 0's root, token 4, was generated twice)
    prompt = torch.zeros(s, vocab, dtype=torch.bool)
    prompt[0, [0, 9]] = True
    prompt[1, 11] = True
    params = [SamplingParams(repetition_penalty=1.7, frequency_penalty=0.4, presence_penalty=0.9),
              SamplingParams(repetition_penalty=0.6, frequency_penalty=-0.3)]
    st = SamplingTensors.build(params, [0, 0], "cpu")
    got = penalize(logits, st.repetition, st.frequency, st.presence, output, prompt, tokens, ancestors)
    for slot, p in enumerate(params):
        for node in range(n):
            counts = {v: int(c) for v, c in enumerate(output[slot]) if c}
            j = node
            while j != 0:  # the node's drafted path, root excluded
                v = int(tokens[slot, j])
                counts[v] = counts.get(v, 0) + 1
                j = parents[j]
            want = reference(logits[slot, node], counts, set(prompt[slot].nonzero()[:, 0].tolist()), p)
            torch.testing.assert_close(got[slot, node].double(), want, atol=1e-5, rtol=1e-6)


def test_rows_without_penalties_come_out_bit_for_bit():
    logits = torch.randn(3, 4, 50)
    st = SamplingTensors.build([SamplingParams(), SamplingParams(repetition_penalty=2.0), SamplingParams()],
                               [0] * 3, "cpu")
    output = torch.randint(0, 3, (3, 50), dtype=torch.int32)
    prompt = torch.rand(3, 50) < 0.5
    got = penalize(logits, st.repetition, st.frequency, st.presence, output, prompt,
                   torch.randint(0, 50, (3, 4)), torch.ones(3, 4, 4, dtype=torch.bool))
    assert torch.equal(got[[0, 2]], logits[[0, 2]]) and not torch.equal(got[1], logits[1])


@pytest.mark.parametrize("bad", [dict(presence_penalty=2.5), dict(frequency_penalty=-3), dict(repetition_penalty=0),
                                 dict(repetition_penalty=-1.0), dict(presence_penalty=float("nan")),
                                 dict(frequency_penalty="1")])
def test_bad_penalties_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_greedy_repetition_penalty_equals_transformers(pair):
    # transformers' RepetitionPenaltyLogitsProcessor: the same rule over prompt + output tokens.
    outs = _llm(pair, "none").generate(prompt_token_ids=PROMPTS, sampling_params=_greedy(repetition_penalty=1.5))
    plain = _llm(pair, "none").generate(prompt_token_ids=PROMPTS, sampling_params=_greedy())
    for prompt, out, free in zip(PROMPTS, outs, plain):
        want = pair[2].generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, repetition_penalty=1.5,
                                pad_token_id=0)[0, len(prompt):].tolist()
        assert out.token_ids == want
    assert [o.token_ids for o in outs] != [o.token_ids for o in plain]


@pytest.mark.parametrize("penalties", PENALTIES[1:])
def test_greedy_presence_and_frequency_equal_a_reference_loop(pair, penalties):
    p = _greedy(12, **penalties)
    outs = _llm(pair, "none").generate(prompt_token_ids=PROMPTS, sampling_params=p)
    for prompt, out in zip(PROMPTS, outs):
        ids, counts = list(prompt), {}
        for _ in range(12):
            with torch.no_grad():
                logits = pair[2](torch.tensor([ids])).logits[0, -1]
            token = int(reference(logits, counts, set(prompt) if p.repetition_penalty != 1 else set(), p).argmax())
            counts[token] = counts.get(token, 0) + 1
            ids.append(token)
        assert out.token_ids == ids[len(prompt):]


@pytest.mark.parametrize("penalties", PENALTIES)
@pytest.mark.parametrize("spec, ngram", [("dflash", 0), ("ddtree", 0), ("ddtree", 4)])
def test_every_method_gives_plain_decodings_tokens_with_penalties(pair, penalties, spec, ngram, monkeypatch):
    params = [_greedy(16, **penalties), SamplingParams(temperature=0.9, max_tokens=16, seed=4, ignore_eos=True,
                                                       **penalties), _greedy(16)]
    plain = [o.token_ids for o in _llm(pair, "none").generate(prompt_token_ids=PROMPTS, sampling_params=params)]
    # A drafter that proposes these very tokens (behind decoys): rounds accept deep paths, on which a token
    # drafted twice must count twice.
    install_oracle(monkeypatch, {tuple(p): p + t for p, t in zip(PROMPTS, plain)}, 64, decoy_rate=0.3)
    outs = _llm(pair, spec, ngram).generate(prompt_token_ids=PROMPTS, sampling_params=params)
    assert [o.token_ids for o in outs] == plain
    assert sum(o.metrics.mean_acceptance_length for o in outs) / len(outs) > 2.0


def test_a_penalised_request_leaves_its_neighbours_tokens_alone(pair):
    free = [_greedy(), SamplingParams(temperature=1.0, max_tokens=20, seed=8, ignore_eos=True), _greedy()]
    mixed = [free[0], dataclasses.replace(free[1], presence_penalty=1.5, repetition_penalty=1.3), free[2]]
    for spec in ("none", "ddtree"):
        want = [o.token_ids for o in _llm(pair, spec).generate(prompt_token_ids=PROMPTS, sampling_params=free)]
        got = [o.token_ids for o in _llm(pair, spec).generate(prompt_token_ids=PROMPTS, sampling_params=mixed)]
        assert got[0] == want[0] and got[2] == want[2] and got[1] != want[1]


def test_a_prompt_over_several_prefill_chunks_counts_whole(pair):
    prompt = (PROMPTS[0] * 6)[:30]
    llm = LLM(str(pair[0]), device="cpu", max_num_seqs=2)
    llm.engine.config = dataclasses.replace(llm.engine.config, prefill_chunk=8)  # 4 chunks, one per step
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=_greedy(12, repetition_penalty=1.5))[0]
    want = pair[2].generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, repetition_penalty=1.5,
                            pad_token_id=0)[0, len(prompt):].tolist()
    assert out.token_ids == want


# --- the joint law of sampled tokens -------------------------------------------------------------------
V, CONTEXT, ROOT, DEPTH, BLOCK = 8, [1, 2, 3, 4], 5, 3, 8
SLOTS, CHUNK = 20000, 10000
PENALISED = SamplingParams(temperature=1.0, repetition_penalty=1.6, presence_penalty=0.7, frequency_penalty=0.5)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from treeflash.checkpoint import load_drafter, load_target

    root = tmp_path_factory.mktemp("penalties-joint")
    path = make_target(root / "t", arch="qwen3", vocab=V, hidden=32, layers=2, heads=2, kv_heads=1, intermediate=32,
                       init_std=0.5, seed=3)
    drafter = make_drafter(root / "d", path, BLOCK)
    return load_hf(path), load_target(path, "cpu", torch.float32)[0], load_drafter(drafter, "cpu", torch.float32)


def exact_joint(hf, params: SamplingParams, penalised: bool = True, masked: bool = True,
                bad_words: list[list[int]] | None = None, own_path: bool = True,
                grammar: dict[int, dict[int, int]] | None = None) -> torch.Tensor:
    """p(y1, y2, y3) [V, V, V] with every position's penalties from its own past (the root counted as output),
    only params.allowed_token_ids (where given and masked) drawable, and no token that would end one of
    `bad_words` (token sequences, vLLM's rule over the output; own_path=False: over the root alone, at every
    position, as a round blind to the drafted path would), and only the tokens `grammar` (an automaton
    {state: {token: next state}}, y1 drawn in state 0) allows in the state the tokens before lead to
    (own_path=False: state 0 at every position)."""
    joint = torch.zeros(V, V, V, dtype=torch.float64)
    st = SamplingTensors.build([params], [0], "cpu")

    def probs(prefix: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = hf(torch.tensor([CONTEXT + [ROOT] + prefix])).logits[0, -1]
        if masked and params.allowed_token_ids is not None:
            allowed = torch.zeros(V, dtype=torch.bool)
            allowed[params.allowed_token_ids] = True
            logits = logits.masked_fill(~allowed, float("-inf"))
        output = [ROOT] + (prefix if own_path else [])
        if grammar is not None:
            state = 0
            for v in prefix if own_path else ():
                state = grammar[state].get(v) if state is not None else None  # (None: a prefix of probability 0)
            if state is not None:
                allowed = torch.zeros(V, dtype=torch.bool)
                allowed[list(grammar[state])] = True
                logits = logits.masked_fill(~allowed, float("-inf"))
        for seq in bad_words or ():
            if len(seq) - 1 <= len(output) and output[len(output) - len(seq) + 1:] == seq[:-1]:
                logits[seq[-1]] = float("-inf")
        if penalised:
            counts = {}
            for v in [ROOT] + prefix:
                counts[v] = counts.get(v, 0) + 1
            logits = reference(logits, counts, set(CONTEXT), params).float()
        return processed_probs(logits[None], st).double()[0]

    p1 = probs([])
    for a in range(V):
        p2 = probs([a])
        for b in range(V):
            joint[a, b] = p1[a] * p2[b] * probs([a, b])
    return joint


def sample_joint(small, params: SamplingParams, bad_words: list[list[int]] | None = None,
                 grammar: dict[int, dict[int, int]] | None = None) -> tuple[torch.Tensor, float]:
    """Counts of (y1, y2, y3) over SLOTS seeds from DDTree-8 rounds with drafts near the target's law (with
    `bad_words` as token sequences, and `grammar` as an automaton in its state 0 at y1, where given)."""
    hf, target, drafter = small
    counts = torch.zeros(V ** DEPTH, dtype=torch.long)
    sp = Speculator(target, drafter, SpecConfig("ddtree", 8), slots=CHUNK, capacity=64, time_stages=False)
    sp.prefill(0, CONTEXT)
    for cache in (sp.cache, sp.draft_cache):
        for t in cache.keys + cache.values:
            t[1:] = t[:1]
    table = exact_joint(hf, params, bad_words=bad_words, grammar=grammar)
    automaton = None if grammar is None else Grammar.from_table(V, 0, grammar)
    marginals = torch.stack([table.sum((1, 2)), table.sum((0, 2)), table.sum((0, 1))]).add(1e-3).log().float()
    draft = torch.cat([marginals, torch.zeros(BLOCK - 1 - DEPTH, V)])
    g = torch.Generator().manual_seed(1)
    per_slot = (draft[None] + 0.7 * torch.randn(CHUNK, *draft.shape, generator=g)).log_softmax(-1)
    sp.draft = lambda state, sampling, depths=None, layout=None: per_slot[:state.bonus.shape[0], :depths]
    means = []
    for start in range(0, SLOTS, CHUNK):
        sp.set_sampling_many(list(range(CHUNK)), [params] * CHUNK, list(range(start, start + CHUNK)),
                             [CONTEXT] * CHUNK, bad_words=[bad_words] * CHUNK, grammars=[automaton] * CHUNK)
        if sp.penalty_counts is not None:
            sp.penalty_counts.output[:, ROOT] = 1  # the root was emitted before these rounds
        if sp.bad_words is not None:
            sp.bad_words.past[:, -1] = ROOT
        s = sp.state
        s.seq_lens.fill_(len(CONTEXT))
        s.active.fill_(True)
        s.bonus.fill_(ROOT)
        got, chunk_means = first_emitted(lambda: sp.round(CHUNK).walk, CHUNK, DEPTH)
        means += chunk_means
        counts += torch.bincount((got[:, 0] * V + got[:, 1]) * V + got[:, 2], minlength=V ** DEPTH)
    return counts, sum(means) / len(means)


def test_sampled_joint_with_penalties_is_exact_and_the_test_has_teeth(small):
    counts, tau = sample_joint(small, PENALISED)
    stat, df, threshold = chi_square(counts, exact_joint(small[0], PENALISED))
    assert tau > 1.5, "the drafts should make rounds accept several tokens"
    assert stat < threshold, (stat, df, threshold)
    # The same samples against the law without penalties, and against one that ignores the drafted path
    # (penalties from the root alone at every depth): both rejected.
    stat, _, threshold = chi_square(counts, exact_joint(small[0], PENALISED, penalised=False))
    assert stat > threshold
    flat = dataclasses.replace(PENALISED)
    hf = small[0]
    joint = torch.zeros(V, V, V, dtype=torch.float64)
    st = SamplingTensors.build([flat], [0], "cpu")

    def root_only(prefix):
        with torch.no_grad():
            logits = hf(torch.tensor([CONTEXT + [ROOT] + prefix])).logits[0, -1]
        return processed_probs(reference(logits, {ROOT: 1}, set(CONTEXT), flat).float()[None], st).double()[0]

    p1 = root_only([])
    for a in range(V):
        p2 = root_only([a])
        for b in range(V):
            joint[a, b] = p1[a] * p2[b] * root_only([a, b])
    stat, _, threshold = chi_square(counts, joint)
    assert stat > threshold


# --- logit_bias -----------------------------------------------------------------------------------------
def test_logit_bias_is_added_before_the_penalties_for_every_method(pair, monkeypatch):
    params = [_greedy(16, logit_bias={7: 4.0, 12: -100.0}, repetition_penalty=1.3),
              SamplingParams(temperature=0.9, max_tokens=16, seed=4, ignore_eos=True, logit_bias={7: 2.5}), _greedy(16)]
    plain = [o.token_ids for o in _llm(pair, "none").generate(prompt_token_ids=PROMPTS, sampling_params=params)]
    # The reference: transformers' logits + the bias, then the repetition penalty, argmax.
    ids = list(PROMPTS[0])
    for _ in range(16):
        with torch.no_grad():
            logits = pair[2](torch.tensor([ids])).logits[0, -1]
        logits[7] += 4.0
        logits[12] -= 100.0
        counts = {t: ids[len(PROMPTS[0]):].count(t) for t in set(ids[len(PROMPTS[0]):])}
        ids.append(int(reference(logits, counts, set(PROMPTS[0]), params[0]).argmax()))
    assert plain[0] == ids[len(PROMPTS[0]):] and 12 not in plain[0]
    free = _llm(pair, "none").generate(prompt_token_ids=PROMPTS, sampling_params=[_greedy(16)] * 3)
    assert plain[2] == free[2].token_ids and plain[0] != free[0].token_ids
    install_oracle(monkeypatch, {tuple(p): p + t for p, t in zip(PROMPTS, plain)}, 64, decoy_rate=0.3)
    for spec, ngram in (("dflash", 0), ("ddtree", 4)):
        outs = _llm(pair, spec, ngram).generate(prompt_token_ids=PROMPTS, sampling_params=params)
        assert [o.token_ids for o in outs] == plain


@pytest.mark.parametrize("bias", [{-1: 1.0}, {3: 101.0}, {3: float("nan")}, {"a": 1.0}, [3], {3: True}])
def test_bad_logit_bias_is_refused(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


def test_a_logit_bias_outside_the_vocabulary_is_refused_before_anything_runs(pair):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        _llm(pair, "none").generate(prompt_token_ids=PROMPTS[:1], sampling_params=_greedy(4, logit_bias={64: 1.0}))

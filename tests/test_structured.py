"""Structured outputs (treeflash/structured.py): the reply is held to its structure, every method gives what
plain decoding with the same structure gives (each tree node masked in the state its drafted path leads to),
and the sampled joint law passes the chi-square test, which rejects the law of masks blind to the path."""

from __future__ import annotations

import json
import random
import re
import time

import numpy as np
import pytest
import torch

from treeflash import LLM, SamplingParams
from treeflash.structured import Grammar, GrammarCompiler, GrammarSlots, StructuredOutputsParams
from treeflash.tree import DraftTree
from helpers import CHARS
from spec_helpers import chi_square, install_oracle
from test_bad_words import pair  # noqa: F401 (a char-level target with a tokenizer, and a drafter)
from test_penalties import _llm, exact_joint, sample_joint, small  # noqa: F401

PROMPTS = ["the cat", "a b c", "zz top"]


def test_params_take_exactly_one_valid_structure():
    assert StructuredOutputsParams(choice=["a", "b"]).pattern() == "(a|b)"
    assert StructuredOutputsParams(choice=["a.b", "c d?"]).pattern() == r"(a\.b|c d\?)"  # literal text
    assert SamplingParams(structured_outputs={"regex": "[ab]+"}).structured_outputs.regex == "[ab]+"
    for bad in ({}, {"regex": "a", "choice": ["a"]}, {"choice": []}, {"choice": [""]}, {"regex": ""},
                {"json": "{not json"}, {"json": 3}, {"json_object": "yes"}, {"grammar": "root ::= x"}):
        with pytest.raises(ValueError, match="structured_outputs"):
            SamplingParams(structured_outputs=bad)
    for clash in ({"allowed_token_ids": [1]}, {"bad_words": ["a"]}, {"min_tokens": 1}):
        with pytest.raises(ValueError, match="cannot be combined"):
            SamplingParams(structured_outputs={"choice": ["a"]}, **clash)


def test_a_whitespace_pattern_shapes_a_json_reply():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    tight = StructuredOutputsParams(json=schema).pattern()
    loose = SamplingParams(structured_outputs={"json": schema, "whitespace_pattern": r"[\n ]{0,3}"}
                           ).structured_outputs.pattern()
    assert re.fullmatch(tight, '{"a": 1}') and not re.fullmatch(tight, '{\n  "a": 1\n}')
    assert re.fullmatch(loose, '{\n  "a": 1\n}') and not re.fullmatch(loose, '{\n    "a": 1}')
    for bad in ({"regex": "x", "whitespace_pattern": " "}, {"json_object": True, "whitespace_pattern": ""}):
        with pytest.raises(ValueError, match="whitespace_pattern"):
            SamplingParams(structured_outputs=bad)


def test_the_compiled_automaton_spells_exactly_the_structure(pair):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(pair[0]))
    compiler = GrammarCompiler(tok, 64)
    grammar = compiler.compile(StructuredOutputsParams(choice=["ab", "a c"]), frozenset({0}))
    assert compiler.compile(StructuredOutputsParams(choice=["ab", "a c"]), frozenset({0})) is grammar  # cached
    char = {c: i + 1 for i, c in enumerate(CHARS)}
    allowed = lambda state: {t for t in range(64) if grammar.allowed[state, t // 8] >> (t % 8) & 1}  # noqa: E731
    step = lambda state, t: int(grammar.next[list(grammar.keys).index(state * 64 + t)])  # noqa: E731
    state = grammar.initial
    assert allowed(state) == {char["a"]}
    state = step(state, char["a"])
    assert allowed(state) == {char["b"], char[" "]}
    done = step(state, char["b"])
    assert allowed(done) == {0}  # the whole match: only the stop token
    assert step(done, 0) == done
    with pytest.raises(ValueError, match="cannot build"):  # "{" is no character of this vocabulary
        compiler.compile(StructuredOutputsParams(json_object=True), frozenset({0}))


def test_a_compile_past_its_time_limit_is_a_clear_error_and_the_next_one_works(pair):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(pair[0]))
    compiler = GrammarCompiler(tok, 64, timeout=0.5)
    exploding = StructuredOutputsParams(regex="(a|b)*a(a|b){20}")  # a DFA of 2**21 states
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"did not compile within 0.5 s"):
        compiler.compile(exploding, frozenset({0}))
    assert time.monotonic() - start < 30  # (stopped, not finished: this one runs for hours)
    worker, compiler._worker = compiler._worker, None  # again: the failure is remembered, no compile runs
    with pytest.raises(ValueError, match=r"did not compile within 0.5 s"):
        compiler.compile(exploding, frozenset({0}))
    compiler._worker = worker
    assert compiler.compile(StructuredOutputsParams(choice=["ab"]), frozenset({0})).num_states == 3  # a new worker
    worker._proc.kill()  # one that died (out of memory, say) between compiles: the next compile starts another
    worker._proc.wait()
    assert compiler.compile(StructuredOutputsParams(regex="(a|b){2}"), frozenset({0})).num_states == 3
    compiler.close()
    with pytest.raises(ValueError, match="structure_compile_timeout"):
        LLM(pair[0], structure_compile_timeout=0)


def test_a_slow_compile_is_kept_on_disk_and_the_next_process_reads_it(pair, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from treeflash import structured

    tok = AutoTokenizer.from_pretrained(str(pair[0]))
    params, stops = StructuredOutputsParams(regex="[ab]{2,4} c"), frozenset({0})
    monkeypatch.setattr(structured, "MIN_SECONDS", 0.0)  # (this one compiles in milliseconds)
    want = GrammarCompiler(tok, 64, store=tmp_path).compile(params, stops)
    [kept] = tmp_path.glob("*.npz")

    def same(grammar: Grammar) -> bool:
        return grammar.initial == want.initial and all(
            np.array_equal(getattr(grammar, name), getattr(want, name)) for name in ("allowed", "keys", "next"))

    # A compiler with its own worker and memory (another process's, as far as the store can tell) reads it.
    reader = GrammarCompiler(tok, 64, store=tmp_path)
    monkeypatch.setattr(reader._worker, "compile", lambda *a: pytest.fail("compiled again"))
    assert same(reader.compile(params, stops))
    with pytest.raises(BaseException, match="compiled again"):  # other stop tokens are another automaton
        reader.compile(params, frozenset({0, 1}))

    kept.write_bytes(b"not an archive")  # a broken file is compiled again, and replaced
    assert same(GrammarCompiler(tok, 64, store=tmp_path).compile(params, stops))
    assert same(Grammar(64, *GrammarCompiler(tok, 64, store=tmp_path)._store.load(params.pattern(), [0])))

    monkeypatch.setattr(structured, "MIN_SECONDS", 60.0)  # a fast compile is not kept
    GrammarCompiler(tok, 64, store=tmp_path).compile(StructuredOutputsParams(choice=["ab"]), stops)
    assert list(tmp_path.glob("*.npz")) == [kept]


def test_the_store_keeps_the_files_read_last_and_a_folder_it_cannot_write_fails_nothing(tmp_path):
    from treeflash.structure_store import StructureStore

    arrays = (0, np.zeros((3, 8), np.uint8), np.arange(500, dtype=np.int64), np.arange(500, dtype=np.int64))
    store = StructureStore(tmp_path, "v", 64)
    store.save("a", [0], arrays)
    size = next(tmp_path.glob("*.npz")).stat().st_size
    store.max_bytes = 2 * size + size // 2  # room for two files
    store.save("b", [0], arrays)
    time.sleep(0.01)
    assert store.load("a", [0]) is not None  # read: now the newest
    store.save("c", [0], arrays)
    assert store.load("b", [0]) is None and store.load("a", [0]) is not None and store.load("c", [0]) is not None
    assert StructureStore(tmp_path, "other vocabulary", 64).load("a", [0]) is None
    assert StructureStore(tmp_path, "v", 72).load("a", [0]) is None  # (rows of another width)

    blocked = tmp_path / "a file"
    blocked.write_text("")
    with pytest.warns(UserWarning, match="not kept"):
        StructureStore(blocked, "v", 64).save("a", [0], arrays)


def _random_grammar(rng: random.Random, states: int, vocab: int) -> dict[int, dict[int, int]]:
    return {s: {t: rng.randrange(states) for t in rng.sample(range(vocab), rng.randint(1, vocab - 1))}
            for s in range(states)}


def test_every_node_of_random_trees_is_masked_in_its_own_paths_state():
    rng = random.Random(0)
    slots, n, vocab, depth = 3, 12, 7, 4
    tables = [_random_grammar(rng, 5, vocab), None, _random_grammar(rng, 3, vocab)]
    grammars = [Grammar.from_table(vocab, 1 if t else 0, t) if t else None for t in tables]
    structure = GrammarSlots(slots, vocab, "cpu")
    structure.start([0, 1, 2], grammars)
    # the slots' outputs so far, walked in on the device as rounds would
    outputs = [[], [], []]
    for s, table in enumerate(tables):
        state = 1 if table else None
        for _ in range(3 if table else 0):
            token = rng.choice(list(table[state]))
            outputs[s].append(token)
            state = table[state][token]
    emitted = torch.tensor([o + [0] * (3 - len(o)) for o in outputs])
    structure.add(emitted, torch.tensor([len(o) for o in outputs]))
    parents = torch.zeros(slots, n, dtype=torch.long)
    depths = torch.zeros(slots, n, dtype=torch.long)
    for s in range(slots):
        for i in range(1, n):
            parents[s, i] = rng.randrange(i) if rng.random() < 0.8 else 0
            depths[s, i] = min(depths[s, parents[s, i]] + 1, depth)
            if depths[s, i] == depth and depths[s, parents[s, i]] == depth:
                parents[s, i], depths[s, i] = 0, 1
    tokens = torch.randint(0, vocab, (slots, n))
    tree = DraftTree(tokens, parents, depths, torch.ones(slots, n, dtype=torch.bool), torch.zeros(slots, n), depth)
    masked = structure.apply(torch.zeros(slots, n, vocab), slice(0, slots), tree)
    for s, table in enumerate(tables):
        for i in range(n):
            path, j = [], i
            while j != 0:
                path.append(int(tokens[s, j]))
                j = int(parents[s, j])
            state = 1 if table else None
            for t in outputs[s] + path[::-1]:
                state = table[state].get(t) if table and state is not None else state
            want = set(range(vocab)) if table is None or state is None else set(table[state])
            got = {t for t in range(vocab) if masked[s, i, t] == 0}
            assert got == want, (s, i)


def _reference(hf, llm, prompt_ids, n, params):
    """Greedy decoding over transformers' logits, masked with outlines-core's own index of the pattern."""
    from outlines_core import Index, Vocabulary

    tok = llm.tokenizer
    vocabulary = Vocabulary(0, {CHARS[i - 1]: [i] for i in range(1, 64) if i - 1 < len(CHARS)})
    index = Index(params.structured_outputs.pattern(), vocabulary)
    state, ids = index.get_initial_state(), list(prompt_ids)
    for _ in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1]
        allowed = torch.zeros(64, dtype=torch.bool)
        allowed[index.get_allowed_tokens(state)] = True
        token = int(logits.masked_fill(~allowed, float("-inf")).argmax())
        ids.append(token)
        if token == tok.eos_token_id:
            break
        state = index.get_next_state(state, token)
    return ids[len(prompt_ids):]


def test_a_prefill_run_twice_gives_the_same_tokens(pair, monkeypatch):
    """A prefill graph's capture runs the prefill for real before its replay does (gpu_check S caught the
    first token's transition taken three times on an H100): running it twice here must change nothing."""
    from treeflash.round import Speculator

    params = [SamplingParams(temperature=0, max_tokens=12, structured_outputs={"regex": r"(ab|cd)+ [a-z]{2,9}7"}),
              SamplingParams(temperature=1.0, max_tokens=12, seed=4, structured_outputs={"regex": r"[a-z ]{4,40}"})]
    want = [o.token_ids for o in _llm(pair, "ddtree").generate(PROMPTS[:2], params)]
    once = Speculator.prefill_and_start

    def twice(self, *args, **kwargs):
        once(self, *args, **kwargs)
        return once(self, *args, **kwargs)

    monkeypatch.setattr(Speculator, "prefill_and_start", twice)
    assert [o.token_ids for o in _llm(pair, "ddtree").generate(PROMPTS[:2], params)] == want


@pytest.mark.parametrize("spec, ngram", [("dflash", 0), ("ddtree", 0), ("ddtree", 4)])
def test_every_method_gives_plain_decodings_tokens_with_a_structure(pair, spec, ngram, monkeypatch):
    plain_llm = _llm(pair, "none")
    structures = [{"regex": r"(ab|cd)+ [a-z]{2,9}7"}, {"choice": ["tree", "oak tree", "pine"]},
                  {"regex": r"[a-z ]{4,40}"}]
    params = [SamplingParams(temperature=0, max_tokens=16, structured_outputs=structures[0]),
              SamplingParams(temperature=1.0, max_tokens=16, seed=4, structured_outputs=structures[1]),
              SamplingParams(temperature=0, max_tokens=16, structured_outputs=structures[2])]
    plain = plain_llm.generate(PROMPTS, params)
    free = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    want = plain_llm.generate(PROMPTS[1], free)[0].token_ids
    for prompt, out, p in zip(PROMPTS, plain, params):
        if p.temperature == 0:
            assert out.token_ids == _reference(pair[2], plain_llm, plain_llm.encode(prompt), 16, p)
    assert re.fullmatch(structures[0]["regex"], plain[0].text) or plain[0].finish_reason == "length"
    assert plain[1].text in structures[1]["choice"] and plain[1].finish_reason == "stop"
    assert re.fullmatch(structures[2]["regex"], plain[2].text)
    install_oracle(monkeypatch, {tuple(o.prompt_token_ids): o.prompt_token_ids + o.token_ids for o in plain}, 64,
                   decoy_rate=0.3)
    outs = _llm(pair, spec, ngram).generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert sum(o.metrics.mean_acceptance_length for o in outs) / len(outs) > 1.5
    # The request beside a structured one keeps its tokens.
    mixed = _llm(pair, spec, ngram).generate(PROMPTS, [params[0], free, params[2]])
    assert mixed[1].token_ids == want and mixed[0].token_ids == plain[0].token_ids


@pytest.mark.parametrize("spec", ["dflash", "ddtree"])
def test_drafts_under_the_structure_or_blind_give_plain_decodings_tokens(pair, spec):
    params = [SamplingParams(temperature=0, max_tokens=16, structured_outputs={"regex": r"(ab|cd)+ [a-z]{2,9}7"}),
              SamplingParams(temperature=0.9, max_tokens=16, seed=2, structured_outputs={"regex": "[a-e ]{3,20}"})]
    plain = [o.token_ids for o in _llm(pair, "none").generate(PROMPTS[:2], params)]
    for adjust in (True, False):
        llm = _llm(pair, spec)
        llm.engine.speculator.adjust_drafts = adjust
        assert [o.token_ids for o in llm.generate(PROMPTS[:2], params)] == plain


def test_drafts_are_masked_along_their_most_likely_allowed_chain():
    vocab = 6
    table = {0: {1: 1, 2: 0}, 1: {3: 2, 4: 0}, 2: {5: 2, 0: 0}}
    structure = GrammarSlots(2, vocab, "cpu")
    structure.start([0, 1], [Grammar.from_table(vocab, 0, table), None])
    logits = torch.randn(2, 3, vocab, generator=torch.Generator().manual_seed(0))
    logits[0, 0, 1] = 9.0  # depth 1 picks 1 (state 1), depth 2 then 3 or 4, whichever the drafter prefers
    got = structure.apply_drafts(logits, slice(0, 2))
    assert torch.isfinite(got[0, 0]).tolist() == [t in (1, 2) for t in range(vocab)]
    assert torch.isfinite(got[0, 1]).tolist() == [t in (3, 4) for t in range(vocab)]
    third = 2 if logits[0, 1, 3] > logits[0, 1, 4] else 0
    assert torch.isfinite(got[0, 2]).tolist() == [t in table[third] for t in range(vocab)]
    assert torch.equal(got[1], logits[1])  # no structure
    # A draft vocabulary without the allowed tokens: that depth keeps the drafter's own logits.
    columns = torch.tensor([0, 3, 4, 5])
    got = structure.apply_drafts(logits[:, :, :4], slice(0, 2), columns)
    assert torch.equal(got[0, 0], logits[0, 0, :4])


GRAMMAR = {0: {0: 1, 2: 0, 3: 0, 5: 2, 6: 1}, 1: {4: 0, 5: 2, 2: 1, 7: 2}, 2: {0: 0, 1: 1, 3: 2, 4: 2, 6: 0}}


def test_sampled_joint_with_a_structure_is_exact_and_the_test_has_teeth(small):
    params = SamplingParams(temperature=1.0, structured_outputs={"regex": "(the automaton is given directly)"})
    counts, tau = sample_joint(small, params, grammar=GRAMMAR)
    stat, df, threshold = chi_square(counts, exact_joint(small[0], params, grammar=GRAMMAR, penalised=False))
    assert tau > 1.5, "the drafts should make rounds accept several tokens"
    assert stat < threshold, (stat, df, threshold)
    joint = counts.view(8, 8, 8)
    assert joint[1].sum() == joint[0, 0, 0].sum() == 0  # 1 is not allowed first; after 0 (state 1) nor is 0
    # Against the law whose masks look at the slot's state alone (blind to each node's drafted path): rejected.
    stat, _, threshold = chi_square(counts, exact_joint(small[0], params, grammar=GRAMMAR, penalised=False,
                                                        own_path=False))
    assert stat > threshold


@pytest.mark.integration
@pytest.mark.slow
def test_the_default_pair_gives_plain_decodings_structured_replies():
    """SmolLM2-135M-Instruct with its shipped drafter (DDTree and the chain) against the target alone."""
    from treeflash import LLM

    person = {"type": "object", "required": ["name", "age"],
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    chats = [[{"role": "user", "content": "Invent a person with a name and an age, as JSON."}],
             [{"role": "user", "content": "Is Paris the capital of France? Answer yes or no."}],
             [{"role": "user", "content": "Write a phone number."}]]
    params = [SamplingParams(temperature=0, max_tokens=48, structured_outputs={"json": person}),
              SamplingParams(temperature=0.8, seed=3, max_tokens=8, structured_outputs={"choice": ["yes", "no"]}),
              SamplingParams(temperature=0, max_tokens=16, structured_outputs={"regex": r"\d{3}-\d{3}-\d{4}"})]
    plain = [LLM(spec="none", device="cpu").chat(c, p, use_tqdm=False)[0] for c, p in zip(chats, params)]
    got = json.loads(plain[0].text)
    assert set(got) == {"name", "age"} and isinstance(got["age"], int)
    assert plain[1].text in ("yes", "no") and re.fullmatch(r"\d{3}-\d{3}-\d{4}", plain[2].text)
    for spec in ("ddtree", "dflash"):
        llm = LLM(spec=spec, device="cpu")
        outs = [llm.chat(c, p, use_tqdm=False)[0] for c, p in zip(chats, params)]
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
        assert outs[0].metrics.mean_acceptance_length > 1.5


def test_the_table_holds_each_automaton_once_and_repacks_in_place():
    grammar = Grammar.from_table(6, 0, {0: {1: 1, 2: 0}, 1: {3: 0}})
    structure = GrammarSlots(3, 6, "cpu")
    tables = (structure.allowed, structure.keys, structure.next)
    structure.start([0, 2], [grammar, grammar])  # one object: stored once
    structure.add(torch.tensor([[1, 0], [0, 0], [0, 0]]), torch.tensor([1, 0, 0]))  # slot 0 now in its state 1
    assert structure.rows_used == 1 + 2 and structure.state.tolist() == [2, 0, 1]
    structure.start([2], [None])  # slot 2 freed: nothing moves
    assert structure.state.tolist() == [2, 0, 0]
    masked = structure.apply(torch.zeros(3, 1, 6), slice(0, 3))
    assert torch.isfinite(masked[0, 0]).tolist() == [t == 3 for t in range(6)] and torch.isfinite(masked[2]).all()
    structure.start([1], [None])  # no structure before or after: nothing to do
    assert (structure.allowed, structure.keys, structure.next) == tables and structure.generation == 1


def test_the_slots_follow_their_automata_through_places_repacks_and_growth():
    rng = random.Random(3)
    vocab, slots = 9, 4
    pool = [Grammar.from_table(vocab, 0, _random_grammar(rng, rng.randint(2, 40), vocab)) for _ in range(12)]
    structure = GrammarSlots(slots, vocab, "cpu")
    own: list = [None] * slots  # (grammar, state) per slot, walked here on the tables themselves
    generations = {structure.generation}
    for step in range(300):
        if rng.random() < 0.3:
            chosen = rng.sample(range(slots), rng.randint(1, 2))
            grammars = [rng.choice(pool + [None]) for _ in chosen]
            structure.start(chosen, grammars)
            for slot, g in zip(chosen, grammars):
                own[slot] = (g, g.initial) if g is not None else None
            generations.add(structure.generation)
        emitted, accepted = torch.zeros(slots, 3, dtype=torch.long), torch.zeros(slots, dtype=torch.long)
        for slot, entry in enumerate(own):
            if entry is None:
                continue
            g, state = entry
            row = np.unpackbits(g.allowed[state], bitorder="little")[:vocab]
            for k in range(rng.randint(0, 3)):
                token = rng.choice(np.flatnonzero(row).tolist())
                emitted[slot, k], accepted[slot] = token, k + 1
                state = int(g.next[np.searchsorted(g.keys, state * vocab + token)])
                row = np.unpackbits(g.allowed[state], bitorder="little")[:vocab]
            own[slot] = (g, state)
        structure.add(emitted, accepted)
        allowed = torch.isfinite(structure.apply(torch.zeros(slots, 1, vocab), slice(0, slots)))[:, 0]
        for slot, entry in enumerate(own):
            expect = [True] * vocab if entry is None else \
                np.unpackbits(entry[0].allowed[entry[1]], bitorder="little")[:vocab].astype(bool).tolist()
            assert allowed[slot].tolist() == expect, (step, slot)
    assert len(generations) > 1  # the tables grew (and kept their place in between)

"""bad_words (vLLM's): no request generates a banned token sequence, and every method generates exactly what
plain decoding with the same bad words does (each tree node masked with its own past: the output so far plus
its drafted path); the sampled joint law passes the chi-square test, which rejects the law without them."""

from __future__ import annotations

import random

import pytest
import torch

from treeflash import SamplingParams
from treeflash.bad_words import MAX_SEQUENCES, MAX_TOKENS, BadWords, bad_word_sequences
from treeflash.tree import DraftTree, ancestor_mask
from helpers import write_char_tokenizer
from spec_helpers import chi_square, install_oracle, load_hf, make_drafter, make_target
from test_penalties import _llm, exact_joint, sample_joint, small  # noqa: F401

PROMPTS = ["the cat", "a b c", "zz top"]


class _Words:
    """A word-initial BPE in miniature: "hello" is [5, 6], " hello" [9, 6]; "hi" [7], " hi" [3, 7]."""

    table = {"hello": [5, 6], " hello": [9, 6], "hi": [7], " hi": [3, 7], "x": [2], " x": [8], "": []}

    def encode(self, text, add_special_tokens=False):
        return self.table.get(text, [ord(c) for c in text])

    def decode(self, ids):
        return "?" * len(ids)


def test_sequences_follow_vllms_rule():
    tok = _Words()
    # the spaced form joins where it has as many tokens and another first one
    assert bad_word_sequences(["hello", "hi", "x", "x"], tok) == [[5, 6], [9, 6], [7], [2], [8]]
    with pytest.raises(ValueError, match="no token"):
        bad_word_sequences([""], tok)
    with pytest.raises(ValueError, match=f"at most {MAX_TOKENS} tokens"):
        bad_word_sequences(["y" * (MAX_TOKENS + 1)], tok)
    with pytest.raises(ValueError, match=f"at most {MAX_SEQUENCES}"):
        bad_word_sequences([f"w{i}" for i in range(MAX_SEQUENCES + 1)], tok)


def _banned(past: list[int], sequences: list[list[int]]) -> set[int]:
    """vLLM's rule: a sequence's last token where the past (the output, newest last) ends with the rest."""
    return {seq[-1] for seq in sequences if len(seq) - 1 <= len(past) and past[len(past) - len(seq) + 1:] == seq[:-1]}


def test_every_node_of_random_trees_is_masked_with_its_own_past():
    rng = random.Random(0)
    slots, n, vocab = 3, 12, 6
    bw = BadWords.new(slots, "cpu")
    sequences = [[[rng.randrange(vocab) for _ in range(rng.randint(1, 4))] for _ in range(5)] for _ in range(slots)]
    sequences[2] = None
    bw.start(list(range(slots)), sequences)
    outputs = [[rng.randrange(vocab) for _ in range(k)] for k in (0, 2, 20)]
    for s, out in enumerate(outputs):
        for t in out:
            bw.add(torch.tensor([[t] if i == s else [0] for i in range(slots)]),
                   torch.tensor([1 if i == s else 0 for i in range(slots)]))
    parents = torch.zeros(slots, n, dtype=torch.long)
    depths = torch.zeros(slots, n, dtype=torch.long)
    tokens = torch.randint(0, vocab, (slots, n), generator=torch.Generator().manual_seed(1))
    for s in range(slots):
        for i in range(1, n):
            parents[s, i] = rng.randrange(i)
            depths[s, i] = depths[s, parents[s, i]] + 1
    logits = torch.randn(slots, n, vocab)
    tree = DraftTree(tokens, parents, depths, torch.ones_like(tokens, dtype=torch.bool), torch.zeros(slots, n),
                     max_depth=int(depths.max()))
    got = bw.apply(logits, slice(0, slots), tree, ancestor_mask(tree))
    for s in range(slots):
        for i in range(n):
            path, node = [], i
            while node:
                path.append(int(tokens[s, node]))
                node = int(parents[s, node])
            want = logits[s, i].clone()
            for t in _banned(outputs[s] + path[::-1], sequences[s] or []):
                want[t] = float("-inf")
            assert torch.equal(got[s, i], want), (s, i)
    # prefill's draw: the output alone
    assert torch.equal(bw.apply(logits[:, :1], slice(0, slots))[1, 0],
                       logits[1, 0].index_fill(0, torch.tensor(sorted(_banned(outputs[1], sequences[1])) or [0]),
                                               float("-inf")) if _banned(outputs[1], sequences[1]) else logits[1, 0])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-words")
    target = make_target(root / "target", vocab=64, head_scale=4.0)
    write_char_tokenizer(target, 64)
    return target, make_drafter(root / "drafter", target, 4), load_hf(target)


def _reference(hf, llm, prompt_ids, n, words):
    sequences = bad_word_sequences(words, llm.tokenizer)
    ids = list(prompt_ids)
    for _ in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1]
        for t in _banned(ids[len(prompt_ids):], sequences):
            logits[t] = float("-inf")
        ids.append(int(logits.argmax()))
    return ids[len(prompt_ids):]


@pytest.mark.parametrize("spec, ngram", [("dflash", 0), ("ddtree", 0), ("ddtree", 4)])
def test_every_method_gives_plain_decodings_tokens_with_bad_words(pair, spec, ngram, monkeypatch):
    plain_llm = _llm(pair, "none")
    free = [o.text for o in plain_llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))]
    # Words the free answers hold: a character of the first, two-character runs of the second and third
    words = [free[0][3], free[1][4:6], free[2][2:4], free[2][8:11]]
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, bad_words=words),
              SamplingParams(temperature=1.0, max_tokens=16, seed=4, ignore_eos=True, bad_words=words),
              SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, bad_words=words[1:])]
    plain = plain_llm.generate(PROMPTS, params)
    for prompt, out, p in zip(PROMPTS, plain, params):
        if p.temperature == 0:
            assert out.token_ids == _reference(pair[2], plain_llm, plain_llm.encode(prompt), 16, p.bad_words)
        assert not any(w in out.text for w in p.bad_words)
    assert plain[0].text != free[0] and plain[2].text != free[2]
    install_oracle(monkeypatch, {tuple(o.prompt_token_ids): o.prompt_token_ids + o.token_ids for o in plain}, 64,
                   decoy_rate=0.3)
    outs = _llm(pair, spec, ngram).generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert sum(o.metrics.mean_acceptance_length for o in outs) / len(outs) > 2.0
    # The request beside one with bad words keeps its tokens.
    mixed = _llm(pair, spec, ngram).generate(PROMPTS, [params[0], SamplingParams(temperature=0, max_tokens=16,
                                                                                   ignore_eos=True), params[2]])
    assert mixed[1].text == free[1]


BAD = [[3], [5, 2], [1, 4, 6]]  # (ROOT is 5: [5, 2] bans 2 at the first draw, and after any drafted 5)


def test_sampled_joint_with_bad_words_is_exact_and_the_test_has_teeth(small):
    params = SamplingParams(temperature=1.0, bad_words=["(their sequences are given directly)"])
    counts, tau = sample_joint(small, params, bad_words=BAD)
    stat, df, threshold = chi_square(counts, exact_joint(small[0], params, bad_words=BAD))
    assert tau > 1.5, "the drafts should make rounds accept several tokens"
    assert stat < threshold, (stat, df, threshold)
    joint = counts.view(8, 8, 8)
    assert joint[:, :, 3].sum() == joint[2].sum() == joint[5, 2].sum() == 0
    # Against the law whose bans look at the root alone (blind to each node's drafted path): rejected.
    stat, _, threshold = chi_square(counts, exact_joint(small[0], params, bad_words=BAD, own_path=False))
    assert stat > threshold


def test_bad_bad_words_are_refused(pair):
    for bad in ("abc", [""], [3], "", [None]):
        with pytest.raises(ValueError, match="bad_words"):
            SamplingParams(bad_words=bad)
    with pytest.raises(ValueError, match="at most"):
        _llm(pair, "none").generate("ab", SamplingParams(max_tokens=2, bad_words=["a" * (MAX_TOKENS + 1)]))

"""A drafter's draft vocabulary (draft_vocab.json): its lm_head covers those tokens only, trees hold real
token ids, and output is exactly what it is without one (greedy and seeded sampling)."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from treeflash import LLM, SamplingParams
from treeflash.models.dflash import DRAFT_VOCAB_FILE, DraftVocab
from treeflash.round import Speculator
from spec_helpers import make_drafter, make_target

VOCAB = 64
PROMPTS = [[3, 5, 7, 11], [2, 4, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1]]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab")
    target = make_target(root / "target", vocab=VOCAB)
    return target, make_drafter(root / "drafter", target, 4)


def with_vocab(drafter, tmp_path, ids, name="drafter-vocab"):
    out = tmp_path / name
    shutil.copytree(drafter, out)
    DraftVocab(tuple(ids)).save(out, note="test")
    return out


def record_trees(monkeypatch) -> list:
    trees, build = [], Speculator.build

    def recording(self, *args, **kwargs):
        tree = build(self, *args, **kwargs)
        trees.append(tree)
        return tree

    monkeypatch.setattr(Speculator, "build", recording)
    return trees


@pytest.mark.parametrize("spec", ["ddtree", "dflash"])
def test_a_permuted_full_vocabulary_drafts_the_same_trees(pair, tmp_path, monkeypatch, spec):
    # The same logits in another order: every tree, hence every round, must be the one drafted without it
    # (this checks the mapping from vocabulary positions back to token ids).
    target, drafter = pair
    ids = list(range(VOCAB))
    random.Random(0).shuffle(ids)
    permuted = with_vocab(drafter, tmp_path, ids)
    trees = record_trees(monkeypatch)
    kw = dict(device="cpu", spec=spec, tree_budget=8, max_num_seqs=2)
    plain = LLM(str(target), draft_model=str(drafter), **kw).generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    plain_trees, trees[:] = list(trees), []
    llm = LLM(str(target), draft_model=str(permuted), **kw)
    assert llm.engine.speculator.draft_head.shape == (VOCAB, 32)
    mapped = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    assert [o.token_ids for o in mapped] == [o.token_ids for o in plain]
    assert len(trees) == len(plain_trees)
    for a, b in zip(trees, plain_trees):
        assert (a.tokens[a.valid] == b.tokens[b.valid]).all()


@pytest.mark.parametrize("spec", ["ddtree", "dflash"])
def test_a_subset_vocabulary_drafts_only_its_tokens_and_changes_no_output(pair, tmp_path, monkeypatch, spec):
    target, drafter = pair
    subset = list(range(0, VOCAB, 3))
    small = with_vocab(drafter, tmp_path, subset)
    trees = record_trees(monkeypatch)
    kw = dict(device="cpu", spec=spec, tree_budget=8, max_num_seqs=2)
    none = LLM(str(target), device="cpu").generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    llm = LLM(str(target), draft_model=str(small), **kw)
    assert [o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)] == \
        [o.token_ids for o in none]
    drafted = {t for tree in trees for t in tree.tokens[:, 1:][tree.valid[:, 1:]].tolist()}
    assert drafted and drafted <= set(subset)
    # Seeded sampling: the same tokens with a draft vocabulary, without one, and without a drafter.
    seeded = [SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, ignore_eos=True, seed=7 + i) for i in range(3)]
    ref = [o.token_ids for o in LLM(str(target), device="cpu").generate(prompt_token_ids=PROMPTS,
                                                                        sampling_params=seeded)]
    assert [o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=seeded)] == ref
    off = LLM(str(target), draft_model=str(small), draft_vocab=False, **kw)
    assert off.engine.speculator.draft_tokens is None
    assert [o.token_ids for o in off.generate(prompt_token_ids=PROMPTS, sampling_params=seeded)] == ref


@pytest.mark.parametrize("content, message", [
    ("{not json", "malformed draft vocabulary"),
    (json.dumps({"ids": [1, 2]}), "malformed draft vocabulary"),
    (json.dumps({"token_ids": []}), "non-empty list of distinct"),
    (json.dumps({"token_ids": [1, 1, 2]}), "non-empty list of distinct"),
    (json.dumps({"token_ids": [1, -2]}), "non-empty list of distinct"),
    (json.dumps({"token_ids": [1, "a"]}), "non-empty list of distinct"),
    (json.dumps({"token_ids": [1, VOCAB]}), "outside the target's vocabulary"),
])
def test_a_bad_draft_vocabulary_is_a_clear_error(pair, tmp_path, content, message):
    target, drafter = pair
    bad = tmp_path / "bad"
    shutil.copytree(drafter, bad)
    (bad / DRAFT_VOCAB_FILE).write_text(content)
    with pytest.raises(ValueError, match=message):
        LLM(str(target), device="cpu", draft_model=str(bad))


def test_most_frequent_tokens_ties_go_to_the_lower_id():
    vocab = DraftVocab.most_frequent([[5, 5, 9, 2], [9, 7, 3, 3]], 3)
    assert vocab.token_ids == (3, 5, 9)  # 5, 9, 3 twice each beat 2 and 7 once
    assert DraftVocab.most_frequent([[4, 1]], 5).token_ids == (1, 4)

"""The penalty kernel (treeflash/penalty_kernel.py) gives `penalize`'s torch ops' output bit for bit, through
Triton's interpreter on the CPU: every node's own drafted path over random trees, the drafts (no path), the
prefill (nothing generated yet), rows without penalties, bfloat16 and float32 logits; and whole generations
with penalties through it give plain decoding's tokens."""

from __future__ import annotations

import random

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash import SamplingParams
from treeflash.penalties import penalize
from treeflash.sampling import SamplingTensors
from treeflash.tree import DraftTree, ancestor_mask
from spec_helpers import random_tree_shape
from test_bad_words import pair  # noqa: F401 (a char-level target with a tokenizer, and a drafter)
from test_penalties import _llm

pytestmark = pytest.mark.usefixtures("mend")

PARAMS = [SamplingParams(repetition_penalty=1.7, frequency_penalty=0.4, presence_penalty=0.9),
          SamplingParams(repetition_penalty=0.6, frequency_penalty=-0.3), SamplingParams(),
          SamplingParams(presence_penalty=-1.1, repetition_penalty=1.05)]


def _tree(rng: random.Random, slots: int, n: int, vocab: int, depth: int) -> DraftTree:
    parents, depths = random_tree_shape(rng, slots, n, depth)
    tokens = torch.tensor([[rng.randrange(vocab // 4) for _ in range(n)] for _ in range(slots)])  # (repeats)
    return DraftTree(tokens, parents, depths, torch.ones(slots, n, dtype=torch.bool), torch.zeros(slots, n),
                     int(depths.max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(2))
def test_the_kernel_equals_the_torch_ops_bit_for_bit(dtype, seed, monkeypatch):
    import treeflash.penalty_kernel as pk

    monkeypatch.setattr(pk, "VOCAB_BLOCK", 128)  # several blocks of the vocabulary a node
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    slots, vocab = len(PARAMS), 300
    st = SamplingTensors.build(PARAMS, [0] * slots, "cpu")
    penalties = (st.repetition, st.frequency, st.presence)
    output = torch.randint(0, 3, (slots, vocab), dtype=torch.int32, generator=gen) * (torch.rand(slots, vocab) < 0.2)
    prompt = torch.rand(slots, vocab, generator=gen) < 0.1
    for n, depth in ((1, 0), (12, 3), (40, 15)):
        tree = _tree(rng, slots, n, vocab, depth)
        logits = (torch.randn(slots, n, vocab, generator=gen) * 4).to(dtype)
        ancestors = ancestor_mask(tree) if n > 1 else None
        for args in ((output, prompt, tree.tokens, ancestors, tree), (output, prompt), (None, prompt)):
            got = penalize(logits, *penalties, *args, kernel=True)
            want = penalize(logits, *penalties, *args[:4], kernel=False)
            assert got.dtype == torch.float32 and torch.equal(got, want), (n, len(args))
        if n > 1:  # (the torch ops make the ancestors from the tree where they are not given)
            assert torch.equal(penalize(logits, *penalties, output, prompt, tree.tokens, None, tree, kernel=False),
                               penalize(logits, *penalties, output, prompt, tree.tokens, ancestors, kernel=False))
        assert torch.equal(got[2], logits[2].float())  # (a row without penalties comes out as it went in)


@pytest.mark.parametrize("spec", ["dflash", "ddtree"])
def test_rounds_through_the_kernel_give_plain_decodings_tokens(pair, spec, monkeypatch):
    import treeflash.round as round_module

    params = [SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.6, ignore_eos=True),
              SamplingParams(temperature=0.9, max_tokens=12, seed=2, presence_penalty=1.2, frequency_penalty=0.5),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]
    prompts = ["the cat", "a b c", "zz top"]
    plain = [o.token_ids for o in _llm(pair, "none").generate(prompts, params)]
    used = []

    def through_the_kernel(*args, **kwargs):
        used.append(True)
        return penalize(*args, **{**kwargs, "kernel": True})

    monkeypatch.setattr(round_module, "penalize", through_the_kernel)
    assert [o.token_ids for o in _llm(pair, spec).generate(prompts, params)] == plain and used

"""How many cache rows an eager forward attends over, and why a request's bits do not follow it on the CPU.

PyTorch's CPU SDPA kernel takes keys in blocks of 512 (SDPA_KV_BLOCK). Over a whole number of blocks a
query row gets the same bits however many masked keys follow its last visible one; over a width that is not,
the last block's vectorised tail sums in another order (~1e-7). The CPU's capacity, its prefill forwards and
its eager rounds therefore span whole blocks: a prompt prefilled beside a longer one, or decoded after the
caches grew for someone else, gets the bits it gets alone, and a round attends over the rows in use rather
than over a cache one long request grew (a server's every later round paid for the whole capacity).
"""

from __future__ import annotations

import pytest
import torch

from treeflash import LLM, SamplingParams
from treeflash.attention import SDPA_KV_BLOCK, attend
from treeflash.checkpoint import load_target
from treeflash.round import PrefillPiece, SpecConfig, Speculator
from treeflash.runner import GraphRunner
from spec_helpers import make_drafter, make_target


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("attention_width")
    target = make_target(root / "target", vocab=64)
    return target, make_drafter(root / "drafter", target, 4)


@pytest.mark.parametrize("visible", [37, 511, 700, 1500])
@pytest.mark.parametrize("new_tokens", [1, 9])
def test_cpu_sdpa_over_whole_key_blocks_gives_the_same_bits_whatever_masked_keys_follow(visible, new_tokens):
    # The property the CPU's widths rely on, in attend's own layout (3 KV heads of 3 query heads each); if a
    # PyTorch release changes its kernel's blocks, this says so.
    gen = torch.Generator().manual_seed(visible + new_tokens)
    q = torch.randn(2, 9, new_tokens, 64, generator=gen)
    k, v = torch.randn(2, 2, 3, 4096, 64, generator=gen).unbind(1)
    outs = []
    for width in range(-(-visible // SDPA_KV_BLOCK) * SDPA_KV_BLOCK, 4097, SDPA_KV_BLOCK):
        mask = torch.zeros(2, new_tokens, width, dtype=torch.bool)
        mask[..., :visible] = True
        mask[1, :, visible // 2:visible] = False  # a second row of another length
        outs.append(attend(q, k[:, :, :width], v[:, :, :width], mask))
    assert len(outs) >= 2 and all(torch.equal(out, outs[0]) for out in outs[1:])


def test_a_prompt_prefilled_beside_a_longer_one_gets_the_bits_it_gets_alone(pair):
    target = load_target(pair[0], "cpu", torch.float32)[0]
    gen = torch.Generator().manual_seed(1)
    short, long = (torch.randint(1, 62, (n,), generator=gen).tolist() for n in (40, 700))

    def prefilled(pieces: list[PrefillPiece]) -> Speculator:
        sp = Speculator(target, None, SpecConfig(), slots=2, capacity=1024, time_stages=False)
        GraphRunner(sp, enabled=False).prefill(pieces)
        return sp

    alone = prefilled([PrefillPiece(0, short, 0, 40)])
    beside = prefilled([PrefillPiece(1, long, 0, 700), PrefillPiece(0, short, 0, 40)])  # 1,024 rows attended
    last = len(alone.cache.keys) - 1  # the last layer's rows: every attention before it went into them
    assert torch.equal(alone.cache.keys[last][0, :, :40], beside.cache.keys[last][0, :, :40])
    assert torch.equal(alone.cache.values[last][0, :, :40], beside.cache.values[last][0, :, :40])


@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_eager_rounds_attend_over_the_rows_in_use_and_emit_what_the_whole_cache_gives(pair, monkeypatch, spec):
    import treeflash.round as round_module

    widths = []
    layout = round_module.round_layout
    monkeypatch.setattr(round_module, "round_layout",
                        lambda s, m, kv_len, *a: widths.append(kv_len) or layout(s, m, kv_len, *a))
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    prompts = [[3, 5, 7, 11], [2, 4, 6, 8, 10] * 20]
    kw = dict(device="cpu", draft_model=str(pair[1]) if spec == "ddtree" else None, spec=spec, max_num_seqs=2)
    fresh = LLM(str(pair[0]), **kw).generate(prompt_token_ids=prompts, sampling_params=params)
    grown = LLM(str(pair[0]), **kw)
    grown.engine.speculator.reserve(4 * SDPA_KV_BLOCK)  # as a long request before would have left it
    widths.clear()
    outs = grown.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in fresh]
    assert widths and set(widths) == {SDPA_KV_BLOCK}  # not the 2,048 rows the caches hold

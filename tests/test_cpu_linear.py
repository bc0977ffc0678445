"""Projections on the CPU through oneDNN's prepacked weights (`models.kernels.linear`, `prepack_cpu`): the product
F.linear gives up to float32 rounding, F.linear itself wherever the copy could be stale (a weight changed in
place, autograd on), nothing attached where memory is short; and the engine's output with and without them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import treeflash.models.kernels as kernels
from treeflash.llm import LLM
from treeflash.models.kernels import bf16_products, linear, prepack_cpu
from treeflash.sampling import SamplingParams

from spec_helpers import make_drafter, make_target

pytestmark = pytest.mark.skipif(not prepack_cpu([]), reason="this PyTorch has no oneDNN linear")


def weights(n=48, k=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen), torch.randn(n, generator=gen), torch.randn(2, 5, k, generator=gen)


def test_prepacked_product_is_f_linears_up_to_rounding():
    w, b, x = weights()
    assert prepack_cpu([w]) and hasattr(w, "_onednn")
    with torch.inference_mode():
        got = linear(x, w, b)
    assert got.shape == (2, 5, 48)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_a_stale_copy_or_autograd_takes_f_linear():
    w, b, x = weights(seed=1)
    prepack_cpu([w])
    with torch.inference_mode():
        w.mul_(2.0)  # changed in place after packing: the copy is stale
        assert torch.equal(linear(x, w, b), F.linear(x, w, b))
    prepack_cpu([w])
    param = torch.nn.Parameter(w.clone())
    prepack_cpu([param])
    y = linear(x, param, b)  # autograd on: F.linear, whose product has a gradient
    assert y.requires_grad and torch.equal(y, F.linear(x, param, b))


def test_nothing_is_packed_where_memory_is_short(monkeypatch):
    w, _, _ = weights(seed=2)
    monkeypatch.setattr(kernels, "_free_memory", lambda: 1000)
    with pytest.warns(UserWarning, match="not prepacking"):
        assert not prepack_cpu([w])
    assert not hasattr(w, "_onednn")


@pytest.mark.parametrize("spec,budget", [("none", 1), ("ddtree", 8), ("dflash", 8)])
def test_the_engine_decodes_the_same_with_and_without_them(tmp_path, spec, budget):
    target = make_target(tmp_path / "t", vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, init_std=0.1, seed=4)
    drafter = make_drafter(tmp_path / "d", target, block_size=8) if spec != "none" else None
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    prompts = [[5, 9, 2], [3, 1, 4, 1, 5, 9]]
    outs = {}
    for prepack in (True, False):
        llm = LLM(str(target), device="cpu", dtype="float32", draft_model=str(drafter) if drafter else None,
                  spec=spec, tree_budget=budget, max_num_seqs=2, cpu_prepack=prepack)
        assert hasattr(llm.model.layers[0].self_attn.o_proj.weight, "_onednn") == prepack
        outs[prepack] = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]
    plain = LLM(str(target), device="cpu", dtype="float32", spec="none", max_num_seqs=2, cpu_prepack=False)
    assert outs[True] == outs[False] == [o.token_ids for o in plain.generate(prompt_token_ids=prompts,
                                                                              sampling_params=params)]


def test_bfloat16_weights_are_packed_where_the_cpu_multiplies_bfloat16():
    """Packed where oneDNN has native bfloat16 products (F.linear's bfloat16 product was slower: benchmarks/
    cpu-bf16-prepack), left to F.linear elsewhere; the product F.linear's up to bfloat16 rounding."""
    w, b, x = (t.bfloat16() for t in weights(seed=3))
    assert prepack_cpu([w])
    assert hasattr(w, "_onednn") == bf16_products()
    with torch.inference_mode():
        got = linear(x, w, b)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 5, 48)
    torch.testing.assert_close(got.float(), F.linear(x.float(), w.float(), b.float()), rtol=2e-2, atol=5e-2)


def test_bfloat16_weights_stay_with_f_linear_where_the_cpu_would_emulate(monkeypatch):
    monkeypatch.setattr(kernels, "bf16_products", lambda: False)
    w, _, _ = (t.bfloat16() for t in weights(seed=4))
    assert prepack_cpu([w]) and not hasattr(w, "_onednn")


def test_a_bfloat16_engine_packs_and_decodes(tmp_path):
    target = make_target(tmp_path / "t", vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, init_std=0.1, seed=5)
    drafter = make_drafter(tmp_path / "d", target, block_size=8)
    llm = LLM(str(target), device="cpu", dtype="bfloat16", draft_model=str(drafter), spec="ddtree", tree_budget=8,
              max_num_seqs=1)
    assert hasattr(llm.model.layers[0].self_attn.o_proj.weight, "_onednn") == bf16_products()
    out = llm.generate(prompt_token_ids=[[5, 9, 2]], sampling_params=SamplingParams(temperature=0.0, max_tokens=12,
                                                                                    ignore_eos=True))[0]
    assert len(out.token_ids) == 12 and all(0 <= t < 64 for t in out.token_ids)

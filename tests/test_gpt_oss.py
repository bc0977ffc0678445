"""GPT-OSS's parts beyond the decoder shared with the others: biased experts with the clamped SwiGLU in every
plan, MXFP4 checkpoints, sliding windows per mask and the backends that refuse windows and sinks.

Its logits, cached decoding, trees and greedy generation against transformers: tests/test_models.py (variant
"gpt_oss"); speculative decoding equal to plain decoding: tests/test_speculative.py ("gptoss-66").
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import hf_model, make_tiny_target
from treeflash import LLM, SamplingParams
from treeflash.attention import CausalMask, check_backend, round_layout, windowed
from treeflash.checkpoint import dequantize_mxfp4, load_target
from treeflash.kv_cache import append_layout
from treeflash.models.layers import SparseMoE

EXPERTS = dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=16, sliding_window=6)


@pytest.fixture(scope="module")
def oss_dir(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("oss") / "t", "gpt_oss", num_layers=2, seed=5, **EXPERTS)


@pytest.fixture(scope="module")
def layer(oss_dir) -> SparseMoE:
    model, _ = load_target(oss_dir, "cpu", torch.float32)
    return model.layers[0].mlp


@torch.no_grad()
@pytest.mark.parametrize("tokens", [1, 4, 17])
def test_the_plans_agree_with_biases_and_the_clamped_activation(layer, tokens):
    x = 3 * torch.randn(tokens, 32, generator=torch.Generator().manual_seed(tokens))
    weights, chosen = layer.route(x)
    gathered = layer._gathered(x, weights, chosen)
    torch.testing.assert_close(layer._dense(x, weights, chosen), gathered, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer._looped(x, weights, chosen), gathered, atol=1e-5, rtol=1e-5)
    from treeflash.models.layers import _grouped_product_runs

    if _grouped_product_runs(layer.stacked[0]):
        torch.testing.assert_close(layer._grouped(x, weights, chosen), gathered, atol=1e-5, rtol=1e-5)
    # the clamp is reached (|gate| or |up| past 7 for some pair), so the test checks it
    gate_up = torch.einsum("eoh,nh->neo", layer.stacked[0], x) + layer.biases[0]
    assert (gate_up.abs() > 7).any()


@pytest.mark.parametrize("plan", ["dense", "looped"])
def test_the_other_plans_decode_as_transformers_does(oss_dir, monkeypatch, plan):
    prompt = [3, 17, 9, 40, 2, 33, 8, 11, 5, 60]
    x = torch.tensor([prompt])
    expected = hf_model(oss_dir).generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=12,
                                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    monkeypatch.setattr(SparseMoE, "plan", lambda self, chosen: plan)
    out = LLM(str(oss_dir), device="cpu").generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True))
    assert out[0].token_ids == expected


def test_mxfp4_dequantizes_as_transformers_does():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 2, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(110, 140, (3, 10, 2), dtype=torch.uint8, generator=gen)
    ours = dequantize_mxfp4(blocks, scales)  # [3, 10, 64], output-major
    assert ours.dtype == torch.bfloat16 and ours.shape == (3, 10, 64)
    assert torch.equal(ours, convert_moe_packed_tensors(blocks, scales).transpose(1, 2))
    with pytest.raises(ValueError, match="expected uint8"):
        dequantize_mxfp4(blocks, scales[..., :1])


def _mxfp4_checkpoint(src, dst):
    """`src`'s checkpoint with its experts' weights replaced by random MXFP4 blocks and scales (OpenAI's layout);
    returns the same weights dequantized by transformers, in the bfloat16 checkpoints' layout, as a second
    directory's checkpoint."""
    import shutil

    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    tensors = load_file(str(src / "model.safetensors"))
    packed, plain = dict(tensors), dict(tensors)
    gen = torch.Generator().manual_seed(1)
    for name in [n for n in tensors if n.endswith(("gate_up_proj", "down_proj"))]:
        experts, rows_in, rows_out = tensors[name].shape  # [E, in, out]
        blocks = torch.randint(0, 256, (experts, rows_out, rows_in // 32, 16), dtype=torch.uint8, generator=gen)
        scales = torch.randint(120, 128, (experts, rows_out, rows_in // 32), dtype=torch.uint8, generator=gen)
        del packed[name]
        packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
        plain[name] = convert_moe_packed_tensors(blocks, scales).float().contiguous()
    dirs = {}
    for kind, content in (("mxfp4", packed), ("plain", plain)):
        d = dst / kind
        shutil.copytree(src, d)
        save_file(content, str(d / "model.safetensors"), metadata={"format": "pt"})
        dirs[kind] = d
    return dirs


def test_an_mxfp4_checkpoint_loads_as_its_dequantized_weights(tmp_path):
    # hidden 64, experts 32 wide: MXFP4 groups of 32 along both projections' inputs
    src = make_tiny_target(tmp_path / "src", "gpt_oss", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=2,
                           num_local_experts=4, num_experts_per_tok=2, intermediate_size=32)
    dirs = _mxfp4_checkpoint(src, tmp_path)
    packed, _ = load_target(dirs["mxfp4"], "cpu", torch.float32)
    plain, _ = load_target(dirs["plain"], "cpu", torch.float32)
    theirs = dict(plain.named_parameters())
    for name, p in packed.named_parameters():
        assert torch.equal(p, theirs[name]), name
    x = torch.tensor([[1, 5, 9, 2]])
    hf = hf_model(dirs["plain"])
    rows, mask = append_layout(torch.tensor([0]), torch.ones(1, 4, 4, dtype=torch.bool).tril(), 4)
    with torch.no_grad():
        hidden, _ = packed(x, rows, packed.new_cache(1, 8), rows, mask)
        torch.testing.assert_close(packed.logits(hidden), hf(x).logits, atol=1e-4, rtol=0)
    # a block without its scales is named
    tensors = load_file(str(dirs["mxfp4"] / "model.safetensors"))
    del tensors["model.layers.0.mlp.experts.down_proj_scales"]
    save_file(tensors, str(dirs["mxfp4"] / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="down_proj_blocks has no down_proj_scales"):
        load_target(dirs["mxfp4"], "cpu", torch.float32)


def test_flex_and_hybrid_refuse_windows_and_sinks():
    for backend in ("flex", "hybrid"):
        with pytest.raises(ValueError, match="does not run sliding-window attention"):
            check_backend(backend, "cuda", 64, windows=True)
        with pytest.raises(ValueError, match="does not run attention sinks"):
            check_backend(backend, "cuda", 64, sinks=True)
    assert check_backend("sdpa", "cpu", 64, windows=True, sinks=True) == "sdpa"


def test_a_window_narrows_every_mask_alike():
    """A 3-node tree (root, two children) after 9 committed rows, window 4: the dense mask narrowed and the
    splitkv mask's first rows and new-row mask say the same; training's causal mask narrowed too."""
    seq, window = torch.tensor([9]), 4
    tree = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)
    positions = torch.tensor([[9, 10, 10]])
    rows, dense = round_layout(seq, tree, 16, "sdpa")
    narrow = windowed(dense, positions, rows, window)
    expected = torch.zeros(1, 3, 16, dtype=torch.bool)
    expected[0, 0, 6:10] = True  # positions 6..9
    expected[0, 1, [7, 8, 9, 10]] = True
    expected[0, 2, [7, 8, 9, 11]] = True
    assert torch.equal(narrow, expected)
    from treeflash.attention import SplitKVMask

    split = windowed(SplitKVMask(seq.to(torch.int32), tree.to(torch.uint8), 16), positions, rows, window)
    assert split.first.tolist() == [[6, 7, 7]] and torch.equal(split.new_mask.bool(), tree)
    causal = windowed(CausalMask(1, 6), torch.arange(6)[None], None, 2)
    ones = torch.ones(6, 6, dtype=torch.bool)
    assert torch.equal(causal[0, 0], ones.tril() & ~ones.tril(-2))  # itself and the one before


@torch.no_grad()
def test_trainings_whole_sequence_pass_is_transformers(oss_dir):
    """train-drafter runs the target over whole sequences (a CausalMask, nothing cached): its windows and sinks
    there too."""
    from treeflash.kv_cache import PrefixKV

    model, _ = load_target(oss_dir, "cpu", torch.float32)
    tokens = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(20).expand(2, 20)
    hidden, _ = model(tokens, positions, PrefixKV(), None, CausalMask(2, 20))
    torch.testing.assert_close(model.logits(hidden), hf_model(oss_dir)(tokens).logits, atol=1e-4, rtol=0)

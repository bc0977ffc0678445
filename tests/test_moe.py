"""Mixtures of experts (Qwen3-MoE, Qwen2-MoE, Mixtral): the layer's plans, its weights' layout, its config.

Parity with transformers (logits, cached decoding, hidden states, greedy generation) is in
tests/test_models.py, and greedy identity of speculative decoding on a mixture in tests/test_speculative.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers import make_tiny_target
from treeflash import LLM, SamplingParams
from treeflash.checkpoint import load_target
from treeflash.config import ConfigError, ModelConfig, UnsupportedModelError
from treeflash.models.dflash import DrafterConfig
from treeflash.models.layers import SparseMoE

EXPERTS = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("moe") / "t", "qwen3_moe", num_layers=2, seed=3, **EXPERTS)


@pytest.fixture(scope="module")
def layer(moe_dir) -> SparseMoE:
    model, _ = load_target(moe_dir, "cpu", torch.float32)
    return model.layers[0].mlp


def grouped_runs_here(layer) -> bool:
    from treeflash.models.layers import _grouped_product_runs

    return _grouped_product_runs(layer.stacked[0])


@torch.no_grad()
@pytest.mark.parametrize("tokens", [1, 3, 4, 5, 17])  # pairs: 2 .. 34, one group of 8 to five
def test_the_plans_agree(layer, tokens):
    """(The gemv plan's Triton kernels: tests/test_moe_kernel.py.)"""
    x = torch.randn(tokens, 32, generator=torch.Generator().manual_seed(tokens))
    weights, chosen = layer.route(x)
    gathered = layer._gathered(x, weights, chosen)
    # (float32 sums in other orders: on an AMD EPYC the dense and grouped plans differ by 2.1e-6 / 1.8e-6 at 5 tokens)
    torch.testing.assert_close(layer._dense(x, weights, chosen), gathered, atol=5e-6, rtol=1e-5)
    torch.testing.assert_close(layer._looped(x, weights, chosen), gathered, atol=5e-6, rtol=1e-5)
    if grouped_runs_here(layer):  # (this PyTorch's grouped product on the CPU)
        torch.testing.assert_close(layer._grouped(x, weights, chosen), gathered, atol=5e-6, rtol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("plan", ["gathered", "looped"])  # the CPU's two, by the experts' size
def test_a_tokens_output_has_the_same_bits_whatever_shares_the_forward_on_the_cpu(layer, monkeypatch, plan):
    """What keeps plain decoding batched equal to alone, bit for bit, on the CPU (docs/exactness.md), with the
    router's weight prepacked as the engine prepacks every projection (models/kernels.py: prepack_cpu)."""
    from treeflash.models.kernels import prepack_cpu

    if not prepack_cpu([layer.gate.weight]):
        pytest.skip("this PyTorch has no oneDNN linear")
    monkeypatch.setattr(layer, "plan", lambda chosen: plan)
    x = torch.randn(13, 32, generator=torch.Generator().manual_seed(0))
    together = layer(x[None])[0]
    for i in range(13):
        assert torch.equal(layer(x[None, i:i + 1])[0, 0], together[i])
    assert torch.equal(layer(x[None, 4:11])[0], together[4:11])


def test_experts_keep_the_checkpoints_names_as_views_of_the_stacked_weights(moe_dir, layer):
    from safetensors.torch import load_file

    saved = load_file(str(moe_dir / "model.safetensors"))
    gate_up, down = layer.stacked
    assert gate_up.shape == (8, 32, 32) and down.shape == (8, 32, 16)
    for e, expert in enumerate(layer.experts):
        for name in ("gate_proj", "up_proj", "down_proj"):
            weight = getattr(expert, name).weight
            assert torch.equal(weight, saved[f"model.layers.0.mlp.experts.{e}.{name}.weight"])
            stack = down if name == "down_proj" else gate_up
            assert weight.untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()  # a view, not a copy
    layer.stack_experts()  # idempotent
    assert layer.stacked[0] is gate_up


@pytest.mark.parametrize("plan", ["dense", "grouped", "looped"])
def test_the_other_plans_decode_as_transformers_does(moe_dir, monkeypatch, plan):
    """This tiny model's experts take the gathered plan on the CPU; larger ones the looped plan, and CUDA groups,
    or without the grouped product takes the dense plan for larger forwards. Forced here, greedy decoding still
    gives transformers' tokens (the plans differ by rounding)."""
    from helpers import hf_model

    model, _ = load_target(moe_dir, "cpu", torch.float32)
    if plan == "grouped" and not grouped_runs_here(model.layers[0].mlp):
        pytest.skip("this PyTorch has no grouped product on the CPU")
    prompt = [3, 17, 9, 40, 2, 33, 8]
    hf = hf_model(moe_dir)
    x = torch.tensor([prompt])
    expected = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=12,
                           eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    monkeypatch.setattr(SparseMoE, "plan", lambda self, chosen: plan)
    out = LLM(str(moe_dir), device="cpu").generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True))
    assert out[0].token_ids == expected


def _config(**fields) -> dict:
    base = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=32, hidden_size=16,
                intermediate_size=32, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=8)
    return {**base, **fields}


def test_which_layers_are_sparse_follows_transformers():
    assert ModelConfig.from_hf(_config()).experts.sparse_layers == (0, 1, 2, 3)
    assert ModelConfig.from_hf(_config(mlp_only_layers=[0, 2])).experts.sparse_layers == (1, 3)
    assert ModelConfig.from_hf(_config(decoder_sparse_step=2)).experts.sparse_layers == (1, 3)
    # transformers 5 writes num_local_experts
    raw = _config(num_local_experts=6)
    del raw["num_experts"]
    assert ModelConfig.from_hf(raw).experts.count == 6


@pytest.mark.parametrize("fields, message", [
    ({"num_experts": None}, "'num_experts' is missing"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 exceeds the 8 experts"),
    ({"moe_intermediate_size": None}, "'moe_intermediate_size' is missing"),
    ({"mlp_only_layers": 3}, "'mlp_only_layers' must be a list"),
])
def test_bad_expert_fields_are_refused_naming_them(fields, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf(_config(**fields))


def _mixtral(**fields) -> dict:
    base = dict(architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=32, hidden_size=16,
                intermediate_size=24, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                num_local_experts=8, num_experts_per_tok=2, sliding_window=None)
    return {k: v for k, v in {**base, **fields}.items() if v is not None or k == "sliding_window"}


def test_mixtral_reads_as_transformers_does():
    """Every layer sparse, experts intermediate_size wide, the chosen weights always rescaled; the window
    read as Mistral's, absent meaning none (transformers' Mixtral default, unlike Mistral's 4096)."""
    experts = ModelConfig.from_hf(_mixtral()).experts
    assert (experts.count, experts.per_token, experts.intermediate_size, experts.normalize,
            experts.sparse_layers, experts.shared_intermediate_size) == (8, 2, 24, True, (0, 1, 2), 0)
    no_window = _mixtral()
    del no_window["sliding_window"]
    ModelConfig.from_hf(no_window)
    ModelConfig.from_hf(_mixtral(sliding_window=4096, max_position_embeddings=4096))
    assert ModelConfig.from_hf(_mixtral(sliding_window=4096, max_position_embeddings=32768)).window(2) == 4096
    with pytest.raises(ConfigError, match="'num_local_experts' is missing"):
        ModelConfig.from_hf(_mixtral(num_local_experts=None))
    with pytest.raises(ConfigError, match="num_experts_per_tok 9 exceeds the 8 experts"):
        ModelConfig.from_hf(_mixtral(num_experts_per_tok=9))


def test_mixtral_checkpoint_names_load_into_the_experts(tmp_path):
    """Mixtral's block_sparse_moe / w1 / w3 / w2 are the decoder's mlp / gate / up / down projections."""
    from safetensors.torch import load_file

    path = make_tiny_target(tmp_path / "m", "mixtral", num_layers=1, num_local_experts=4, num_experts_per_tok=2,
                            intermediate_size=16)
    saved = load_file(str(path / "model.safetensors"))
    layer = load_target(path, "cpu", torch.float32)[0].layers[0].mlp
    assert isinstance(layer, SparseMoE)
    assert torch.equal(layer.gate.weight, saved["model.layers.0.block_sparse_moe.gate.weight"])
    for e, expert in enumerate(layer.experts):
        for ours, theirs in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            assert torch.equal(getattr(expert, ours).weight,
                               saved[f"model.layers.0.block_sparse_moe.experts.{e}.{theirs}.weight"])


def test_a_drafter_config_copying_its_targets_expert_counts_still_loads(tmp_path):
    """A DFlash drafter's layers are dense whatever its target: expert fields copied from the target are moot."""
    target = make_tiny_target(tmp_path / "t", "qwen3_moe", num_layers=3, **EXPERTS)
    t = json.loads((target / "config.json").read_text())
    cfg = {**t, "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 1,
           "num_target_layers": 3, "block_size": 4, "dflash_config": {"mask_token_id": 63}}
    drafter = DrafterConfig.from_hf(cfg)
    assert drafter.layers.experts is None
    drafter.check_target(ModelConfig.from_dir(target))

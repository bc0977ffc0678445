"""A few tokens' mixture-of-experts MLP as Triton kernels (treeflash/moe_kernel.py), run by Triton's interpreter
on CPU tensors: the gathered plan's result up to float32 rounding, with the same bits for a token alone and in
a batch, and greedy decoding through it equal to transformers'."""

from __future__ import annotations

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from helpers import hf_model, make_tiny_target
from treeflash import LLM, SamplingParams
from treeflash.checkpoint import load_target
from treeflash.models.layers import SparseMoE
from treeflash.moe_kernel import Launch, expert_mlp

pytestmark = pytest.mark.usefixtures("mend")
EXPERTS = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("moe") / "t", "qwen3_moe", num_layers=2, seed=5,
                            hidden_size=40, **EXPERTS)


@pytest.fixture(scope="module")
def layer(moe_dir) -> SparseMoE:
    return load_target(moe_dir, "cpu", torch.float32)[0].layers[0].mlp


@torch.no_grad()
@pytest.mark.parametrize("tokens", [1, 3, 7])
@pytest.mark.parametrize("launch", [Launch(), Launch(block_j=8, block_h=16, block_i=8, block_k=16)])
def test_the_kernels_give_the_gathered_plans_result(layer, tokens, launch):
    """Blocks wider than the layer (the default) and narrower ones (hidden 40 and width 24 in steps of 16: the
    last step partial) alike."""
    x = torch.randn(tokens, 40, generator=torch.Generator().manual_seed(tokens))
    weights, chosen = layer.route(x)
    got = expert_mlp(x, *layer.stacked, weights, chosen, launch)
    torch.testing.assert_close(got, layer._gathered(x, weights, chosen), atol=1e-6, rtol=1e-5)


@torch.no_grad()
def test_a_tokens_output_has_the_same_bits_alone_and_in_a_batch(layer):
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    weights, chosen = layer.route(x)
    together = expert_mlp(x, *layer.stacked, weights, chosen)
    for i in range(6):
        assert torch.equal(expert_mlp(x[i:i + 1], *layer.stacked, weights[i:i + 1], chosen[i:i + 1])[0], together[i])


@torch.no_grad()
def test_bfloat16_weights_and_rows(layer):
    """bfloat16 in and out, float32 inside: the float32 result of the same bfloat16 numbers, up to the rounding of
    the activations between the two kernels and of the output."""
    x = torch.randn(2, 40, generator=torch.Generator().manual_seed(1))
    weights, chosen = layer.route(x)
    gate_up, down = (w.bfloat16() for w in layer.stacked)
    got = expert_mlp(x.bfloat16(), gate_up, down, weights.bfloat16(), chosen)
    assert got.dtype == torch.bfloat16
    want = expert_mlp(x.bfloat16().float(), gate_up.float(), down.float(), weights.bfloat16().float(), chosen)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


def test_greedy_decoding_through_the_kernels_is_transformers(moe_dir, monkeypatch):
    prompt = [3, 17, 9, 40, 2, 33, 8]
    hf = hf_model(moe_dir)
    x = torch.tensor([prompt])
    expected = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=10,
                           eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    monkeypatch.setattr(SparseMoE, "plan", lambda self, chosen: "gemv")
    out = LLM(str(moe_dir), device="cpu").generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0, max_tokens=10, ignore_eos=True))
    assert out[0].token_ids == expected


@torch.no_grad()
@pytest.mark.parametrize("tokens", [1, 5])
def test_gpt_oss_experts_biases_and_clamped_activation(tmp_path, tokens):
    """GPT-OSS's experts (biases, the clamped SwiGLU, reached by these inputs) through the kernels: the gathered
    plan's result."""
    path = make_tiny_target(tmp_path / "oss", "gpt_oss", num_layers=1, seed=2, hidden_size=40, num_heads=4,
                            num_kv_heads=2, head_dim=8, num_local_experts=8, num_experts_per_tok=2, intermediate_size=24)
    layer = load_target(path, "cpu", torch.float32)[0].layers[0].mlp
    x = 3 * torch.randn(tokens, 40, generator=torch.Generator().manual_seed(tokens))
    weights, chosen = layer.route(x)
    got = expert_mlp(x, *layer.stacked, weights, chosen, Launch(block_j=8, block_h=16, block_i=8, block_k=16),
                     biases=layer.biases, limit=layer.config.swiglu_limit)
    torch.testing.assert_close(got, layer._gathered(x, weights, chosen), atol=1e-5, rtol=1e-5)
    assert ((torch.einsum("eoh,nh->neo", layer.stacked[0], x) + layer.biases[0]).abs() > 7).any()
    for other in (dict(), dict(biases=layer.biases)):  # without them, or silu * up: another result
        assert not torch.allclose(expert_mlp(x, *layer.stacked, weights, chosen, **other), got, atol=1e-3)

"""The target decoder against Hugging Face transformers, and the loader's refusals and errors.

Every supported architecture variant is a tiny random float32 checkpoint written by `save_pretrained`;
transformers loading the same directory is the reference for logits, cached decoding, hidden states and
greedy generation.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import hf_model, make_tiny_target, one_thread, set_config_fields
from treeflash import LLM, SamplingParams
from treeflash.checkpoint import load_target
from treeflash.config import SUPPORTED_ARCHITECTURES, ConfigError, ModelConfig, UnsupportedModelError
from treeflash.kv_cache import append_layout
from treeflash.round import SpecConfig, Speculator

ATOL = 1e-4  # float32 on logits of magnitude ~1
VOCAB = 64
PROMPT_LEN = 80  # longer than the llama3 case's original context (64), so rope scaling matters

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

# name -> (family, make_tiny_target overrides)
VARIANTS = {
    "llama_untied": ("llama", {}),
    "llama_tied": ("llama", {"tie": True}),
    # head_dim 16: wavelengths from 6 to ~6000 positions, so all three llama3 bands (kept, smoothed, scaled) occur.
    "llama3_rope": ("llama", {"rope_parameters": LLAMA3_ROPE, "max_position_embeddings": 1024,
                              "num_heads": 2, "num_kv_heads": 1, "head_dim": 16}),
    # YaRN (Qwen3's model cards' long-context setting): every frequency band and the cos/sin scale.
    "qwen3_yarn": ("qwen3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 64},
                             "max_position_embeddings": 256, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16}),
    "qwen2_bias": ("qwen2", {}),
    "qwen3_qk_norm": ("qwen3", {"tie": True}),
    # Mixtures of experts: 8 experts, 2 per token, rescaled; layer 1 dense (mlp_only_layers). The prompts'
    # lengths give forwards of both plans on CUDA (gathered where 3 N k <= 8, dense otherwise).
    "qwen3_moe": ("qwen3_moe", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                                "norm_topk_prob": True, "mlp_only_layers": [1]}),
    # Qwen2-MoE's shared expert and its sigmoid gate; weights not rescaled; every other layer sparse.
    "qwen2_moe": ("qwen2_moe", {"num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 16,
                                "shared_expert_intermediate_size": 24, "decoder_sparse_step": 2}),
    # Mixtral: every layer sparse, experts intermediate_size wide, always rescaled; its checkpoint's own names
    # (block_sparse_moe, w1 / w3 / w2).
    "mixtral": ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 16}),
    # A sliding window (every layer) shorter than the prompts: each token sees its last 24 positions.
    "mistral_window": ("mistral", {"sliding_window": 24}),
    # SmolLM3: layer 1 without rotary embeddings (NoPE); then windows on the NoPE layers 0 and 2, as
    # use_sliding_window gives them.
    "smollm3": ("smollm3", {"no_rope_layers": [1, 0, 1], "tie": True,
                            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    "smollm3_window": ("smollm3", {"no_rope_layers": [0, 1, 0], "use_sliding_window": True, "sliding_window": 24,
                                   "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    # Phi-3: fused q/k/v and gate/up weights, a window on every layer (Phi-3-mini-4k's kind).
    "phi3_window": ("phi3", {"sliding_window": 24}),
    # Phi-4-mini's kind: half of each head rotated, LongRoPE's short factors and its cos/sin scale.
    "phi3_longrope": ("phi3", {"tie": True, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
                               "partial_rotary_factor": 0.5, "rope_parameters": {
                                   "rope_type": "longrope", "rope_theta": 10000.0, "factor": 4.0,
                                   "short_factor": [1.0, 1.5, 2.0, 4.0], "long_factor": [1.0, 2.0, 4.0, 8.0]},
                               "original_max_position_embeddings": 256}),
    # Gemma 3: (1 + w) norms around attention and MLP, q/k norms, a scaled embedding, a GELU gate; windows on
    # layers 0 and 1 with their own RoPE base, layer 2 full with linear scaling.
    "gemma3": ("gemma3", {"tie": True, "sliding_window": 24, "query_pre_attn_scalar": 8,
                          "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
                          "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                 "rope_theta": 100000.0},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}}}),
    # GPT-OSS: windows on layers 0 and 2, attention sinks, biased router and experts with the clamped SwiGLU
    # (the experts' weights at init_std 0.3 reach the clamp), YaRN.
    "gpt_oss": ("gpt_oss", {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 16,
                            "sliding_window": 24, "rope_parameters": {
                                "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64}}),
}


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    with one_thread():
        yield


class Variant:
    """One checkpoint with its treeflash model, its HF reference and a few prompts."""

    def __init__(self, name: str, root: Path):
        family, overrides = VARIANTS[name]
        self.name = name
        self.path = make_tiny_target(root / name, family, vocab_size=VOCAB, num_layers=3,
                                     seed=len(name), **overrides)
        self.hf = hf_model(self.path)
        self.model, self.config = load_target(self.path, "cpu", torch.float32)
        gen = torch.Generator().manual_seed(1)
        self.prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=gen).tolist()
        self.prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (5, 70, 1, 23, 41)]
        self._greedy = {}

    @torch.no_grad()
    def hf_logits(self, ids: list[int]) -> torch.Tensor:
        return self.hf(torch.tensor([ids])).logits[0]

    @torch.no_grad()
    def hf_greedy(self, ids: list[int], n: int = 32) -> list[int]:
        key = tuple(ids)
        if key not in self._greedy:
            x = torch.tensor([ids])
            out = self.hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                   eos_token_id=None, pad_token_id=0)
            self._greedy[key] = out[0, len(ids):].tolist()
        return self._greedy[key]


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory) -> Variant:
    return Variant(request.param, tmp_path_factory.mktemp("models"))


@torch.no_grad()
def prefill(model, ids: list[int], capacity: int = 256, capture=()):
    """Run a prompt through treeflash's decoder into a fresh one-slot cache: (logits [T, V], cache, captured)."""
    cache = model.new_cache(1, capacity)
    n = len(ids)
    rows, mask = append_layout(torch.tensor([0]), torch.ones(1, n, n, dtype=torch.bool).tril(), n)
    hidden, captured = model(torch.tensor([ids]), rows, cache, rows, mask, capture)
    return model.logits(hidden)[0], cache, captured


# --- parity with transformers -------------------------------------------------------------------

def test_prompt_logits_match_transformers(variant):
    logits, _, _ = prefill(variant.model, variant.prompt)
    torch.testing.assert_close(logits, variant.hf_logits(variant.prompt), atol=ATOL, rtol=0)


@torch.no_grad()
def test_cached_decode_step_matches_transformers_with_past_key_values(variant):
    prompt, nxt = variant.prompt, 17
    _, cache, _ = prefill(variant.model, prompt)
    n = len(prompt)
    rows, mask = append_layout(torch.tensor([n]), torch.ones(1, 1, 1, dtype=torch.bool), n + 1)
    hidden, _ = variant.model(torch.tensor([[nxt]]), rows, cache, rows, mask)
    past = variant.hf(torch.tensor([prompt]), use_cache=True).past_key_values
    expected = variant.hf(torch.tensor([[nxt]]), past_key_values=past).logits[0, -1]
    torch.testing.assert_close(variant.model.logits(hidden)[0, -1], expected, atol=ATOL, rtol=0)


@torch.no_grad()
def test_one_forward_decodes_slots_of_different_lengths(variant):
    """Two slots with different committed lengths, one new token each, in a single forward."""
    model, a, b = variant.model, variant.prompts[1], variant.prompts[3]
    cache = model.new_cache(2, 128)
    for slot, ids in enumerate((a, b)):
        n = len(ids)
        rows, mask = append_layout(torch.tensor([0]), torch.ones(1, n, n, dtype=torch.bool).tril(), n)
        model(torch.tensor([ids]), rows, cache.slot(slot), rows, mask)
    seq_lens = torch.tensor([len(a), len(b)])
    rows, mask = append_layout(seq_lens, torch.ones(2, 1, 1, dtype=torch.bool), max(len(a), len(b)) + 1)
    hidden, _ = model(torch.tensor([[5], [9]]), rows, cache, rows, mask)
    logits = model.logits(hidden)[:, 0]
    torch.testing.assert_close(logits[0], variant.hf_logits(a + [5])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], variant.hf_logits(b + [9])[-1], atol=ATOL, rtol=0)


def test_chunked_prefill_matches_transformers(variant):
    speculator = Speculator(variant.model, None, SpecConfig(), slots=1, capacity=128)
    logits = speculator.prefill(0, variant.prompt, chunk=7)
    torch.testing.assert_close(logits, variant.hf_logits(variant.prompt)[-1], atol=ATOL, rtol=0)


@torch.no_grad()
def test_captured_layers_are_transformers_hidden_states(variant):
    """capture_layers=(i,) returns the output of decoder layer i, which is HF `hidden_states[i + 1]`.

    HF applies the final norm to its last entry, so for the last layer norm(captured) is compared.
    """
    layers = tuple(range(variant.config.num_layers))
    _, _, captured = prefill(variant.model, variant.prompt, capture=layers)
    expected = variant.hf(torch.tensor([variant.prompt]), output_hidden_states=True).hidden_states
    for i in layers[:-1]:
        torch.testing.assert_close(captured[i][0], expected[i + 1][0], atol=ATOL, rtol=0)
    torch.testing.assert_close(variant.model.norm(captured[-1])[0], expected[-1][0], atol=ATOL, rtol=0)


@torch.no_grad()
def test_tree_mask_sibling_sees_only_its_ancestors(variant):
    """Tokens [a, b, c] at positions [p, p+1, p+1], where c sees a and itself but not its sibling b.

    c's logits must be those of the plain sequence prompt + [a, c], and b's those of prompt + [a, b]:
    this is what tree verification relies on.
    """
    model, prompt = variant.model, variant.prompts[3]
    a, b, c = 11, 29, 40
    _, cache, _ = prefill(model, prompt)
    p = len(prompt)
    tree = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)
    rows, mask = append_layout(torch.tensor([p]), tree, p + 3)
    hidden, _ = model(torch.tensor([[a, b, c]]), torch.tensor([[p, p + 1, p + 1]]), cache, rows, mask)
    logits = model.logits(hidden)[0]
    plain_c, _, _ = prefill(model, prompt + [a, c])
    plain_b, _, _ = prefill(model, prompt + [a, b])
    torch.testing.assert_close(logits[2], plain_c[-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[1], plain_b[-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[2], variant.hf_logits(prompt + [a, c])[-1], atol=ATOL, rtol=0)


GREEDY_32 = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def test_greedy_generation_matches_transformers_generate(variant):
    out = LLM(variant.path, device="cpu").generate(prompt_token_ids=[variant.prompt], sampling_params=GREEDY_32)
    assert out[0].token_ids == variant.hf_greedy(variant.prompt)
    assert out[0].finish_reason == "length"


def test_batched_greedy_with_continuous_admission_matches_transformers(variant):
    """Five prompts of different lengths through two slots: requests join as others finish."""
    llm = LLM(variant.path, device="cpu", max_num_seqs=2)
    lengths = [32, 7, 32, 20, 3]  # different max_tokens, so slots free up at different rounds
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    outs = llm.generate(prompt_token_ids=variant.prompts, sampling_params=params)
    for prompt, n, out in zip(variant.prompts, lengths, outs):
        assert out.prompt_token_ids == prompt
        assert out.token_ids == variant.hf_greedy(prompt)[:n]


# --- refused architectures ----------------------------------------------------------------------

def write_config(path: Path, **cfg) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    base = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6)
    (path / "config.json").write_text(json.dumps({**base, **cfg}))
    return path


@pytest.mark.parametrize("arch", ["DeepseekV3ForCausalLM", "MambaForCausalLM", "Gemma2ForCausalLM",
                                  "Qwen3NextForCausalLM", "GPT2LMHeadModel", "LlavaForConditionalGeneration"])
def test_unsupported_architecture_is_refused_naming_it_and_the_supported_ones(tmp_path, arch):
    path = write_config(tmp_path / "m", architectures=[arch])
    with pytest.raises(UnsupportedModelError) as err:
        LLM(path, device="cpu")
    message = str(err.value)
    assert arch in message
    for supported in SUPPORTED_ARCHITECTURES:
        assert supported in message


def test_sliding_attention_layers_are_refused(tmp_path):
    path = write_config(tmp_path / "m", architectures=["Qwen3ForCausalLM"], num_hidden_layers=2,
                        layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(UnsupportedModelError, match="sliding_attention.*only full attention"):
        LLM(path, device="cpu")


def test_linear_attention_layers_are_refused_as_hybrid(tmp_path):
    path = write_config(tmp_path / "m", architectures=["Qwen3ForCausalLM"], num_hidden_layers=2,
                        layer_types=["linear_attention", "full_attention"])
    with pytest.raises(UnsupportedModelError, match="Qwen3ForCausalLM.*recurrent"):
        LLM(path, device="cpu")


def test_sliding_window_and_experts_in_a_supported_architecture_are_refused(tmp_path):
    sliding = write_config(tmp_path / "sw", architectures=["Qwen2ForCausalLM"], use_sliding_window=True,
                           sliding_window=16)
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        LLM(sliding, device="cpu")
    moe = write_config(tmp_path / "moe", architectures=["Qwen3ForCausalLM"], num_experts=8)
    with pytest.raises(UnsupportedModelError, match="MoE"):
        LLM(moe, device="cpu")


@pytest.mark.parametrize("cfg, window", [
    # transformers gives a Mistral config without the key a 4096-token window, and applies it to every layer
    ({"max_position_embeddings": 8192}, 4096),
    ({"max_position_embeddings": 4096}, None),  # the window covers every position: changes nothing
    ({"max_position_embeddings": 32768, "sliding_window": None}, None),
    ({"max_position_embeddings": 32768, "sliding_window": 32768}, None),
    ({"max_position_embeddings": 32768, "sliding_window": 4096}, 4096),
    ({"max_position_embeddings": 32768, "sliding_window": 0}, "refused"),  # no window of any use (transformers fails)
    ({"max_position_embeddings": 32768, "sliding_window": True}, "refused"),
    ({}, 4096),  # and its context defaults to 131,072
])
def test_mistral_sliding_window_as_transformers_reads_it(tmp_path, cfg, window):
    from treeflash.config import ModelConfig

    raw = {**json.loads((write_config(tmp_path / "m") / "config.json").read_text()),
           "architectures": ["MistralForCausalLM"], "model_type": "mistral", **cfg}
    if window == "refused":
        with pytest.raises(UnsupportedModelError, match="sliding-window"):
            ModelConfig.from_hf(raw)
        return
    config = ModelConfig.from_hf(raw)
    assert config.max_position_embeddings == cfg.get("max_position_embeddings", 131072)
    assert config.sliding_window == window
    assert [config.window(i) for i in range(config.num_layers)] == [window] * config.num_layers


def test_gpt_oss_windows_as_transformers_reads_them(tmp_path):
    """Every other layer from the first where layer_types is absent, else the layers it names; a 128-token window
    where sliding_window is absent; the experts' limit and MXFP4 quantization read, other quantizations refused."""
    from treeflash.config import ModelConfig

    raw = {**json.loads((write_config(tmp_path / "m") / "config.json").read_text()), "num_hidden_layers": 4,
           "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_local_experts": 4,
           "num_experts_per_tok": 2}
    config = ModelConfig.from_hf(raw)
    assert [config.window(i) for i in range(4)] == [128, None, 128, None] and config.attention_sinks
    assert config.qkv_bias and config.o_bias and config.experts.bias and config.experts.swiglu_limit == 7.0
    named = ModelConfig.from_hf(raw | {"sliding_window": 16, "layer_types": ["full_attention"] * 3
                                       + ["sliding_attention"]})
    assert [named.window(i) for i in range(4)] == [None, None, None, 16]
    assert ModelConfig.from_hf(raw | {"quantization_config": {"quant_method": "mxfp4"}}).experts is not None
    with pytest.raises(UnsupportedModelError, match="quantised"):
        ModelConfig.from_hf(raw | {"quantization_config": {"quant_method": "gptq"}})
    with pytest.raises(UnsupportedModelError, match="swiglu_limit 5.0"):
        ModelConfig.from_hf(raw | {"swiglu_limit": 5.0})
    with pytest.raises(ConfigError, match="layer_types names 2 layers"):
        ModelConfig.from_hf(raw | {"layer_types": ["full_attention", "sliding_attention"]})
    with pytest.raises(UnsupportedModelError, match="chunked_attention"):
        ModelConfig.from_hf(raw | {"layer_types": ["chunked_attention"] * 4})


def test_smollm3_nope_layers_theta_and_windows_as_transformers_reads_them(tmp_path):
    """Every fourth layer without rotary embeddings where no_rope_layers is absent (else the 0s it holds), a
    RoPE base of 2,000,000 where none is given, windows only on sliding layers with use_sliding_window; masks
    and attention that transformers would run with different windows are refused, a malformed list named."""
    import transformers

    from treeflash.config import ModelConfig

    raw = {**json.loads((write_config(tmp_path / "m") / "config.json").read_text()), "num_hidden_layers": 8,
           "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3"}
    raw.pop("rope_theta", None)
    config = ModelConfig.from_hf(raw)
    theirs = transformers.SmolLM3Config(**{k: v for k, v in raw.items() if k != "architectures"},
                                        pad_token_id=None, bos_token_id=None, eos_token_id=None)
    assert config.nope_layers == (3, 7) == tuple(i for i, f in enumerate(theirs.no_rope_layers) if not f)
    assert config.rope.theta == 2_000_000.0 == theirs.rope_parameters["rope_theta"]
    assert config.window_layers == () and config.max_position_embeddings == theirs.max_position_embeddings
    given = ModelConfig.from_hf(raw | {"no_rope_layers": [1, 0] * 4 + [1, 1], "no_rope_layer_interval": 3})
    assert given.nope_layers == (1, 3, 5, 7)
    windowed = ModelConfig.from_hf(raw | {"use_sliding_window": True, "sliding_window": 16})
    assert [windowed.window(i) for i in range(8)] == [None] * 3 + [16] + [None] * 3 + [16]
    with pytest.raises(UnsupportedModelError, match="would disagree"):
        ModelConfig.from_hf(raw | {"sliding_window": 16, "layer_types": ["sliding_attention"] * 8})
    for bad in ([1, 0], [1, 2] * 4, [True] * 8):
        with pytest.raises(ConfigError, match="no_rope_layers"):
            ModelConfig.from_hf(raw | {"no_rope_layers": bad})


def test_phi3_rope_as_transformers_reads_it(tmp_path):
    """Phi-3.5-mini's kind of config: LongRoPE without a factor (max_position_embeddings over the top-level
    original context), a partial rotation: frequencies and cos/sin scale as transformers
    computes them for sequences within the original context, to which the context is limited (with a warning);
    factors of the wrong length, other scalings and tensor parallelism refused by name."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from treeflash.config import ModelConfig
    from treeflash.models.layers import rope_inv_freq
    from treeflash.models.parallel import TensorParallelConfigError, check_shardable

    raw = {**json.loads((write_config(tmp_path / "m") / "config.json").read_text()), "hidden_size": 64,
           "num_attention_heads": 2, "num_key_value_heads": 1, "architectures": ["Phi3ForCausalLM"],
           "model_type": "phi3", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
           "partial_rotary_factor": 0.75, "rope_theta": 10000.0, "attention_bias": True,
           "rope_scaling": {"type": "longrope", "short_factor": [1.0 + i / 8 for i in range(12)],
                            "long_factor": [2.0 + i for i in range(12)]}}
    with pytest.warns(UserWarning, match="limited to its short factors' 4096 positions"):
        config = ModelConfig.from_hf(raw)
    theirs = transformers.Phi3Config(**{k: v for k, v in raw.items() if k != "architectures"})
    inv_freq, scale = ROPE_INIT_FUNCTIONS["longrope"](theirs, "cpu", seq_len=4096)
    assert config.rope.kind == "longrope" and config.rope.partial == 0.75
    assert config.rope.attention_factor == pytest.approx(scale, rel=1e-12)
    ours = rope_inv_freq(config.rope, config.head_dim)
    assert torch.equal(ours[:12], inv_freq) and not ours[12:].any()
    assert config.max_position_embeddings == 4096 and not config.qkv_bias and config.window_layers == ()
    with pytest.warns(UserWarning, match="limited"):  # (transformers 5 maps "su" to longrope, then fails to read it)
        assert ModelConfig.from_hf(raw | {"rope_scaling": raw["rope_scaling"] | {"type": "su"}}).rope == config.rope
    with pytest.raises(TensorParallelConfigError, match="does not split Phi3ForCausalLM"):
        check_shardable(config, 2)
    with pytest.raises(ConfigError, match="short_factor must be a list of 12"):
        ModelConfig.from_hf(raw | {"rope_scaling": raw["rope_scaling"] | {"short_factor": [1.0] * 16}})
    with pytest.raises(UnsupportedModelError, match="'dynamic' for Phi3ForCausalLM"):
        ModelConfig.from_hf(raw | {"rope_scaling": {"type": "dynamic", "factor": 2.0}})
    with pytest.raises(ConfigError, match="partial_rotary_factor 0.3 rotates 9"):
        ModelConfig.from_hf(raw | {"partial_rotary_factor": 0.3, "rope_scaling": None})


def test_a_multimodal_gemma3_checkpoints_text_decoder_is_transformers_on_text(tmp_path):
    """Gemma 3 4B and up ship as Gemma3ForConditionalGeneration (a vision tower beside the text decoder): its text
    decoder is read (the vision tensors are not), and on text its logits and greedy tokens are transformers'."""
    import transformers

    from helpers import tiny_hf_config

    text = tiny_hf_config("gemma3", vocab_size=VOCAB, num_layers=3, sliding_window=24, query_pre_attn_scalar=8,
                          tie=True, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                          rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5},
                                           "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})
    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                                    image_token_index=VOCAB - 1, boi_token_index=VOCAB - 3, eoi_token_index=VOCAB - 2)
    with torch.random.fork_rng():
        torch.manual_seed(4)
        theirs = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # (Gemma's norm weights start at zero: 1 + w is then 1 everywhere)
        for name, p in theirs.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.3)
    theirs.save_pretrained(tmp_path / "mm")
    model, config = load_target(tmp_path / "mm", "cpu", torch.float32)
    assert config.architecture == "Gemma3ForConditionalGeneration" and config.local_rope_layers == (0, 1)
    ids = torch.randint(0, VOCAB - 3, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        expected = theirs(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(prefill(model, ids)[0], expected, atol=2e-5, rtol=2e-5)
    llm = LLM(str(tmp_path / "mm"), device="cpu", dtype="float32", spec="none")
    out = llm.generate(prompt_token_ids=[ids[:12]], sampling_params=SamplingParams(temperature=0.0, max_tokens=20,
                                                                                   ignore_eos=True))[0]
    x = torch.tensor([ids[:12]])
    with torch.no_grad():
        reference = theirs.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=20,
                                    eos_token_id=None, pad_token_id=0)[0, 12:].tolist()
    assert out.token_ids == reference


def test_gemma3_config_as_transformers_reads_it(tmp_path):
    """Gemma 3 1B's kind of config.json (transformers 4's keys): every sixth layer full, the others a window with
    the local RoPE base; the global base and scaling from rope_theta and rope_scaling; transformers 5's
    per-layer-type rope_parameters read alike; what the decoder does not run refused by name."""
    import transformers

    from treeflash.config import ModelConfig
    from treeflash.models.parallel import TensorParallelConfigError, check_shardable

    raw = {**json.loads((write_config(tmp_path / "m") / "config.json").read_text()), "num_hidden_layers": 12,
           "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": 16,
           "query_pre_attn_scalar": 16, "sliding_window": 512, "sliding_window_pattern": 6,
           "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear",
                                                                                    "factor": 8.0},
           "max_position_embeddings": 32768, "hidden_activation": "gelu_pytorch_tanh"}
    raw.pop("hidden_act", None)
    config = ModelConfig.from_hf(raw)
    theirs = transformers.Gemma3TextConfig(**{k: v for k, v in raw.items() if k != "architectures"},
                                           pad_token_id=None, bos_token_id=None, eos_token_id=None)
    sliding = tuple(i for i, t in enumerate(theirs.layer_types) if t == "sliding_attention")
    assert config.local_rope_layers == config.window_layers == sliding == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)
    assert config.sliding_window == theirs.sliding_window == 512
    full, local = theirs.rope_parameters["full_attention"], theirs.rope_parameters["sliding_attention"]
    assert (config.rope.kind, config.rope.factor, config.rope.theta) == (full["rope_type"], full["factor"],
                                                                         full["rope_theta"])
    assert (config.local_rope.kind, config.local_rope.theta) == (local["rope_type"], local["rope_theta"])
    assert config.norm_offset and config.sandwich_norms and config.qk_norm and config.tie_word_embeddings
    assert config.embed_scale == raw["hidden_size"] ** 0.5 and config.activation == "gelu_tanh"
    v5 = {k: v for k, v in raw.items() if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")}
    assert ModelConfig.from_hf(v5 | {"rope_parameters": theirs.rope_parameters}) == config
    for bad, match in (({"query_pre_attn_scalar": 12}, "query_pre_attn_scalar 12"),
                       ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
                       ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
                       ({"use_bidirectional_attention": True}, "bidirectional"),
                       ({"hidden_activation": "relu"}, "hidden_activation 'relu'")):
        with pytest.raises(UnsupportedModelError, match=match):
            ModelConfig.from_hf(raw | bad)
    with pytest.raises(TensorParallelConfigError, match="Gemma3ForCausalLM"):
        check_shardable(config, 2)
    # a multimodal checkpoint's text_config (Gemma 3 4B's keys): the rest at transformers' defaults
    text = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}
    mm = ModelConfig.from_hf({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                              "eos_token_id": [1, 106], "text_config": text})
    theirs = transformers.Gemma3TextConfig(**text)
    for ours, key in ((mm.vocab_size, "vocab_size"), (mm.num_heads, "num_attention_heads"), (mm.head_dim, "head_dim"),
                      (mm.num_kv_heads, "num_key_value_heads"), (mm.max_position_embeddings, "max_position_embeddings"),
                      (mm.rms_norm_eps, "rms_norm_eps"), (mm.tie_word_embeddings, "tie_word_embeddings")):
        assert ours == getattr(theirs, key), key
    assert mm.eos_token_ids == (1, 106) and mm.rope.factor == 8.0 and mm.local_rope.theta == 10000.0
    assert len(mm.window_layers) == 34 - 34 // 6 and mm.sliding_window == 1024
    with pytest.raises(ConfigError, match="text_config"):
        ModelConfig.from_hf({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3"})


def test_config_json_read_as_transformers_reads_it(tmp_path):
    from treeflash.config import ConfigError, ModelConfig

    base = json.loads((write_config(tmp_path / "m") / "config.json").read_text())
    # transformers runs what model_type names; where architectures names another model, refuse
    with pytest.raises(UnsupportedModelError, match="model_type 'gemma'"):
        ModelConfig.from_hf({**base, "architectures": ["LlamaForCausalLM"], "model_type": "gemma"})
    with pytest.raises(UnsupportedModelError, match="model_type 'mistral'"):
        ModelConfig.from_hf({**base, "architectures": ["LlamaForCausalLM"], "model_type": "mistral"})
    # its defaults for an absent context length, per model
    for arch, positions in (("LlamaForCausalLM", 2048), ("Qwen2ForCausalLM", 32768), ("Qwen3ForCausalLM", 32768)):
        assert ModelConfig.from_hf({**base, "architectures": [arch]}).max_position_embeddings == positions
    with pytest.raises(ConfigError, match="num_attention_heads 6 is not a multiple of num_key_value_heads 4"):
        ModelConfig.from_hf({**base, "architectures": ["LlamaForCausalLM"], "hidden_size": 24,
                             "num_attention_heads": 6, "num_key_value_heads": 4})


def test_unsupported_rope_scaling_is_refused(tmp_path):
    path = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"],
                        rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    with pytest.raises(UnsupportedModelError, match="dynamic"):
        LLM(path, device="cpu")


@pytest.mark.parametrize("both", [
    {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}, "rope_scaling": {"type": "linear", "factor": 2.0}},
    {"rope_theta": 1e6, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
     "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
])
def test_rope_scaling_beside_rope_parameters_is_read_as_transformers_reads_it(tmp_path, both):
    # rope_parameters used to win over rope_scaling: a v5 config with rope_scaling added ran plain RoPE.
    from transformers import AutoConfig

    from treeflash.config import RopeConfig
    path = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"], model_type="llama", **both)
    hf = AutoConfig.from_pretrained(path).rope_parameters
    with pytest.warns(UserWarning, match="rope_scaling is used and rope_parameters ignored"):
        rope = RopeConfig.from_hf(json.loads((path / "config.json").read_text()))
    assert (rope.kind, rope.factor, rope.theta) == (hf["rope_type"], hf["factor"], hf["rope_theta"])


def test_an_unsupported_rope_scaling_beside_rope_parameters_is_refused(tmp_path):
    path = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"], rope_parameters={"rope_type": "default"},
                        rope_scaling={"rope_type": "longrope", "factor": 4.0})
    with pytest.raises(UnsupportedModelError, match="longrope"):
        LLM(path, device="cpu")


# --- broken directories -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_dir(tmp_path_factory) -> Path:
    return make_tiny_target(tmp_path_factory.mktemp("good") / "m", "llama", vocab_size=32, num_layers=1)


def copy_config(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


def test_missing_directory_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model directory"):
        LLM(tmp_path / "nowhere", device="cpu")


def test_directory_without_config_json_is_a_file_not_found_error(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LLM(tmp_path / "m", device="cpu")


def test_malformed_config_json_is_a_value_error(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],')
    with pytest.raises(ValueError, match="malformed config.json"):
        LLM(tmp_path / "m", device="cpu")


CONFIG_KEYS = dict(architectures=["LlamaForCausalLM"], vocab_size=32, hidden_size=16, intermediate_size=32,
                   num_hidden_layers=1, num_attention_heads=2)


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads"])
def test_missing_config_key_is_named(tmp_path, key):
    cfg = {k: v for k, v in CONFIG_KEYS.items() if k != key}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=f"config.json: required key '{key}' is missing"):
        LLM(tmp_path / "m", device="cpu")


@pytest.mark.parametrize("key,value,kind", [
    ("vocab_size", "100", "an integer"), ("num_attention_heads", True, "an integer"),
    ("hidden_size", 16.5, "an integer"),
    ("rms_norm_eps", "small", "a number"), ("tie_word_embeddings", "yes", "true or false"),
    ("rope_scaling", "linear", "an object"), ("hidden_act", 3, "a string"), ("layer_types", "full", "a list"),
    ("eos_token_id", [2, "x"], "an integer or a list of integers"), ("num_key_value_heads", 0, "at least 1"),
])
def test_mistyped_config_key_is_named(tmp_path, key, value, kind):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**CONFIG_KEYS, key: value}))
    with pytest.raises(ConfigError, match=f"'{key}' must be {kind}"):
        LLM(tmp_path / "m", device="cpu")


def test_config_errors_name_the_file(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**CONFIG_KEYS, "rope_scaling": {"factor": "big"}}))
    where = re.escape(f"{tmp_path / 'm' / 'config.json'} rope parameters")
    with pytest.raises(ConfigError, match=f"{where}: 'factor' must be a number"):
        LLM(tmp_path / "m", device="cpu")


def test_architectures_as_one_string_is_read_as_that_architecture():
    cfg = ModelConfig.from_hf({**CONFIG_KEYS, "architectures": "Qwen3ForCausalLM"})
    assert cfg.architecture == "Qwen3ForCausalLM" and cfg.qk_norm
    with pytest.raises(UnsupportedModelError, match="unsupported architecture 'GPT2LMHeadModel'"):
        ModelConfig.from_hf({**CONFIG_KEYS, "architectures": "GPT2LMHeadModel"})
    with pytest.raises(ConfigError, match="'architectures' must be a list of names"):
        ModelConfig.from_hf({**CONFIG_KEYS, "architectures": {"name": "LlamaForCausalLM"}})


def test_config_json_that_is_not_an_object_is_a_config_error(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        LLM(tmp_path / "m", device="cpu")


class _Tripwire:
    """Unpickling this creates a marker file: proof that a pickle was loaded."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_pickle_weights_are_never_loaded(tmp_path, good_dir):
    path = copy_config(good_dir, tmp_path / "m")
    marker = tmp_path / "unpickled"
    (path / "pytorch_model.bin").write_bytes(pickle.dumps(_Tripwire(marker)))
    with pytest.raises(FileNotFoundError, match="pickle-based weights are never loaded") as err:
        LLM(path, device="cpu")
    assert "pytorch_model.bin" in str(err.value)
    assert not marker.exists()


def test_corrupt_safetensors_is_a_value_error(tmp_path, good_dir):
    path = copy_config(good_dir, tmp_path / "m")
    (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}" + b"\0" * 64)
    with pytest.raises(ValueError, match="cannot read safetensors"):
        LLM(path, device="cpu")


def test_truncated_safetensors_is_a_value_error(tmp_path, good_dir):
    path = copy_config(good_dir, tmp_path / "m")
    data = (good_dir / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match="cannot read safetensors"):
        LLM(path, device="cpu")


def test_checkpoint_missing_a_tensor_names_it(tmp_path, good_dir):
    path = copy_config(good_dir, tmp_path / "m")
    tensors = load_file(good_dir / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"lacks 1 tensors.*layers\.0\.mlp\.up_proj\.weight"):
        LLM(path, device="cpu")


def test_tensor_with_wrong_shape_names_it_and_both_shapes(tmp_path, good_dir):
    path = copy_config(good_dir, tmp_path / "m")
    tensors = load_file(good_dir / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(7)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"norm\.weight has shape \(7,\), config implies \(32,\)"):
        LLM(path, device="cpu")


def test_unexpected_tensor_is_a_value_error(tmp_path, good_dir):
    path = copy_config(good_dir, tmp_path / "m")
    tensors = load_file(good_dir / "model.safetensors")
    tensors["model.layers.0.self_attn.extra.weight"] = torch.ones(3)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match="does not use"):
        LLM(path, device="cpu")


def test_config_disagreeing_with_weights_is_a_value_error(tmp_path, good_dir):
    path = copy_config(good_dir, tmp_path / "m")
    (path / "model.safetensors").write_bytes((good_dir / "model.safetensors").read_bytes())
    set_config_fields(path, intermediate_size=48)
    with pytest.raises(ValueError, match="has shape"):
        LLM(path, device="cpu")


def test_directory_without_tokenizer_takes_token_ids_but_refuses_text(good_dir):
    llm = LLM(good_dir, device="cpu")
    assert llm.tokenizer is None
    out = llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].token_ids) == 4 and out[0].text == ""
    with pytest.raises(ValueError, match="no tokenizer files"):
        llm.generate("hello")


# --- read as transformers reads them (found by a review of loading) --------------------------------

@pytest.mark.parametrize("extra", [{}, {"original_max_position_embeddings": 128}])
def test_llama3_rope_context_defaults_as_in_transformers(tmp_path, extra):
    # Without original_max_position_embeddings in the rope parameters, transformers takes
    # max_position_embeddings (a top-level key is not read); treeflash took 8192, another RoPE.
    from transformers import AutoConfig

    rope = {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    path = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"], model_type="llama",
                        max_position_embeddings=256, rope_parameters=rope, **extra)
    hf = AutoConfig.from_pretrained(path).rope_parameters
    assert ModelConfig.from_dir(path).rope.original_max_position_embeddings == hf["original_max_position_embeddings"]


@pytest.mark.parametrize("yarn", [
    {"factor": 4.0, "original_max_position_embeddings": 64},  # Qwen3's model cards' form
    {"factor": 8.0, "original_max_position_embeddings": 4096, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False},
    {"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.707},  # DeepSeek's
    {"factor": 2.0, "original_max_position_embeddings": 128, "attention_factor": 1.25},
    {"factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
     "truncate": False, "rope_theta": 150000.0},  # gpt-oss's
])
def test_yarn_frequencies_and_scale_are_transformers(yarn):
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from treeflash.config import RopeConfig
    from treeflash.models.layers import rope_inv_freq

    params = {"rope_type": "yarn", "rope_theta": 10000.0, **yarn}
    hf = Qwen3Config(hidden_size=64, num_attention_heads=2, head_dim=32, max_position_embeddings=16384,
                     rope_parameters=dict(params))
    want_freq, want_scale = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    rope = RopeConfig.from_hf({"max_position_embeddings": 16384, "rope_parameters": params})
    assert rope.kind == "yarn" and rope.attention_factor == pytest.approx(want_scale, rel=1e-12)
    torch.testing.assert_close(rope_inv_freq(rope, 32), want_freq, rtol=0, atol=0)


@pytest.mark.parametrize("rope, missing", [
    ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}, "low_freq_factor"),
    ({"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}, "factor"),
    ({"rope_type": "linear"}, "factor"),
    ({"rope_type": "yarn", "original_max_position_embeddings": 64}, "factor"),
])
def test_a_scaled_rope_without_its_factors_is_refused(tmp_path, rope, missing):
    path = write_config(tmp_path / "m", architectures=["LlamaForCausalLM"], rope_parameters=rope)
    with pytest.raises(ConfigError, match=f"needs {missing}"):
        ModelConfig.from_dir(path)


def test_quantised_checkpoints_and_odd_head_dims_are_refused(tmp_path):
    path = write_config(tmp_path / "q", architectures=["LlamaForCausalLM"],
                        quantization_config={"quant_method": "awq", "bits": 4})
    with pytest.raises(UnsupportedModelError, match="quantised checkpoints are not supported.*awq"):
        ModelConfig.from_dir(path)
    path = write_config(tmp_path / "odd", architectures=["LlamaForCausalLM"], head_dim=7)
    with pytest.raises(ConfigError, match="head dimension 7 is odd"):
        ModelConfig.from_dir(path)


def test_a_config_json_that_is_not_utf8_is_named(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_bytes(b'{"architectures": ["\xff"]}')
    with pytest.raises(ConfigError, match="malformed config.json"):
        LLM(tmp_path / "m", device="cpu")

"""FP8 checkpoints (quant_method "fp8": float8 weights with float32 block scales, as Qwen's and DeepSeek's FP8
releases ship them): read by multiplying the scales out at load, into the engine's dtype."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import hf_model, make_tiny_target, one_thread
from spec_helpers import make_drafter
from treeflash import LLM, SamplingParams
from treeflash.checkpoint import dequantize_fp8, load_target
from treeflash.config import ModelConfig, UnsupportedModelError
from treeflash.kv_cache import append_layout

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
E4M3_MAX = 448.0


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    with one_thread():
        yield


@torch.no_grad()
def prefill(model, ids: list[int]) -> tuple[torch.Tensor, None, None]:
    cache = model.new_cache(1, 64)
    n = len(ids)
    rows, mask = append_layout(torch.tensor([0]), torch.ones(1, n, n, dtype=torch.bool).tril(), n)
    hidden, _ = model(torch.tensor([ids]), rows, cache, rows, mask, ())
    return model.logits(hidden)[0], None, None


def quantize(weight: torch.Tensor, block: tuple[int, int], dtype=torch.float8_e4m3fn):
    """A weight as an FP8 release stores it: each block's largest magnitude scaled to the format's largest value,
    the grid's last blocks cut short. Returns (float8 weight, float32 scales)."""
    rows, cols = weight.shape
    grid = torch.empty(-(-rows // block[0]), -(-cols // block[1]))
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            piece = weight[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
            grid[i, j] = piece.abs().max().clamp(min=1e-12) / torch.finfo(dtype).max
    full = grid.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return (weight / full).to(dtype), grid


def dequantized_by_loops(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    out = weight.float().clone()
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]] *= scale[i, j]
    return out


def make_fp8_target(path: Path, block: tuple[int, int] | None = (16, 16), arch: str = "qwen3",
                    **config) -> Path:
    """A tiny random target whose decoder-layer projections are stored as FP8 (the embeddings, norms and head
    stay float32, as the releases leave them); config.json says so."""
    path = make_tiny_target(path, arch, **config)
    file = path / "model.safetensors"
    tensors = load_file(file)
    for name in list(tensors):
        if name.endswith(".weight") and name.split(".")[-2] in LINEAR:
            weight = tensors[name]
            if block is None:
                scale = weight.abs().max() / E4M3_MAX
                tensors[name], tensors[name + "_scale_inv"] = (weight / scale).to(torch.float8_e4m3fn), scale
            else:
                tensors[name], tensors[name + "_scale_inv"] = quantize(weight, block)
    save_file(tensors, file, metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                  "weight_block_size": None if block is None else list(block)}
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path


def write_dequantized_copy(fp8_dir: Path, out: Path, block: tuple[int, int] | None) -> Path:
    """The same model as a float32 checkpoint, its weights multiplied out by loops (the reference)."""
    out.mkdir()
    tensors = load_file(fp8_dir / "model.safetensors")
    plain = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            scale = tensors[name + "_scale_inv"]
            t = t.float() * scale if block is None else dequantized_by_loops(t, scale, block)
        plain[name] = t
    save_file(plain, out / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((fp8_dir / "config.json").read_text())
    del cfg["quantization_config"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def test_an_fp8_checkpoint_loads_as_transformers_dequantises_it(tmp_path):
    """transformers (no FP8 GPU here) multiplies the same scales out: the same weights to the bit, the same logits."""
    path = make_fp8_target(tmp_path / "fp8", block=(16, 16))
    ours, cfg = load_target(path, "cpu", torch.float32)
    assert cfg.fp8 is not None and cfg.fp8.block == (16, 16)
    theirs = hf_model(path)
    reference = dict(theirs.named_parameters())
    for name, param in ours.named_parameters():
        if name.split(".")[-2] in LINEAR:
            assert torch.equal(param, reference[f"model.{name}"]), name
    ids = [3, 17, 5, 42, 9, 1, 30]
    with torch.no_grad():
        expected = theirs(torch.tensor([ids])).logits[0]
    got, _, _ = prefill(ours, ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("block", [(16, 16), (32, 48), (8, 128), None])
def test_fp8_weights_are_their_blocks_times_their_scales(tmp_path, block):
    """Grids whose last blocks are cut short (a dimension not a multiple of the block: the projections are 8, 40
    and 72 wide) and one scale a tensor, against loops over the blocks."""
    path = make_fp8_target(tmp_path / "fp8", block=block, hidden_size=40, num_heads=5, num_kv_heads=1, head_dim=8,
                           intermediate_size=72)
    model, _ = load_target(path, "cpu", torch.float32)
    raw = load_file(path / "model.safetensors")
    for name, param in model.named_parameters():
        if name.split(".")[-2] in LINEAR:
            weight, scale = raw[f"model.{name}"], raw[f"model.{name}_scale_inv"]
            expected = weight.float() * scale if block is None else dequantized_by_loops(weight, scale, block)
            assert torch.equal(param, expected), name


def test_an_fp8_target_decodes_as_its_dequantised_copy_with_and_without_a_drafter(tmp_path):
    """Through LLM: the same tokens as the float32 copy of its weights, greedy and seeded, plain and DDTree."""
    fp8 = make_fp8_target(tmp_path / "fp8", block=(16, 16))
    plain = write_dequantized_copy(fp8, tmp_path / "plain", (16, 16))
    drafter = make_drafter(tmp_path / "drafter", plain, block_size=4)
    prompts = [[3, 17, 5, 42], [9, 1, 30]]
    for params in (SamplingParams(max_tokens=12, temperature=0.0),
                   SamplingParams(max_tokens=12, temperature=1.0, seed=7)):
        expected = LLM(plain, device="cpu").generate(prompt_token_ids=prompts, sampling_params=params,
                                                     use_tqdm=False)
        for kwargs in ({}, {"draft_model": drafter, "tree_budget": 8}):
            got = LLM(fp8, device="cpu", **kwargs).generate(prompt_token_ids=prompts, sampling_params=params,
                                                            use_tqdm=False)
            assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected], kwargs


def test_bfloat16_dequantisation_rounds_once():
    """Multiplied in float32, then rounded to the engine's dtype (transformers' order), not rounded twice."""
    weight, scale = quantize(torch.randn(64, 64), (32, 32))
    got = dequantize_fp8(weight, scale, (32, 32), torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, dequantized_by_loops(weight, scale, (32, 32)).to(torch.bfloat16))


def test_e5m2_weights_are_read_too():
    weight, scale = quantize(torch.randn(16, 24), (16, 8), dtype=torch.float8_e5m2)
    assert torch.equal(dequantize_fp8(weight, scale, (16, 8), torch.float32),
                       dequantized_by_loops(weight, scale, (16, 8)))


def _edit(path: Path, change) -> None:
    file = path / "model.safetensors"
    tensors = load_file(file)
    change(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("model.layers.0.self_attn.q_proj.weight_scale_inv"),
     "layers.0.self_attn.q_proj.weight is torch.float8_e4m3fn with no layers.0.self_attn.q_proj.weight_scale_inv or "
     "layers.0.self_attn.q_proj.weight_scale beside it"),
    (lambda t: t.update({"model.layers.0.self_attn.q_proj.weight_scale_inv": torch.ones(3, 2)}),
     r"tensor layers.0.self_attn.q_proj.weight: scales \(3, 2\) for a weight \(32, 32\) in blocks of \[16, 16\]: "
     r"expected \(2, 2\)"),
    (lambda t: t.update({"model.norm.weight_scale_inv": torch.ones(1)}),
     "norm.weight_scale_inv scales norm.weight, which is not float8"),
])
def test_a_malformed_fp8_checkpoint_is_named(tmp_path, change, message):
    path = make_fp8_target(tmp_path / "fp8", block=(16, 16))
    _edit(path, change)
    with pytest.raises(ValueError, match=message):
        LLM(path, device="cpu")


def test_activation_scales_are_dropped(tmp_path):
    """A static-activation release's input scales serve only an FP8 kernel: read past, not refused."""
    path = make_fp8_target(tmp_path / "fp8", block=(16, 16))
    _edit(path, lambda t: t.update({"model.layers.0.mlp.down_proj.activation_scale": torch.tensor(0.5),
                                    "model.layers.1.mlp.up_proj.input_scale": torch.tensor(0.25)}))
    load_target(path, "cpu", torch.float32)


@pytest.mark.parametrize("quantization, message", [
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size must be two positive integers"),
    ({"quant_method": "fp8", "weight_block_size": [0, 128]}, "weight_block_size must be two positive integers"),
    ({"quant_method": "fp8", "fmt": "e2m1"}, "fmt 'e2m1' is not an 8-bit float format"),
])
def test_an_fp8_quantization_config_this_engine_cannot_read_is_refused(tmp_path, quantization, message):
    path = make_tiny_target(tmp_path / "m", "qwen3")
    cfg = json.loads((path / "config.json").read_text()) | {"quantization_config": quantization}
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_hf(cfg)


def test_fp8_without_a_block_size_has_a_scale_a_tensor_or_row():
    """AutoFP8's releases (Meta-Llama-3-8B-Instruct-FP8, say) name no block size: one scale a tensor."""
    assert ModelConfig.from_hf(_qwen3_config() | {"quantization_config": {"quant_method": "fp8"}}).fp8.block is None


def test_an_autofp8_checkpoint_loads(tmp_path):
    """quant_method fp8, static activations, no block size: X.weight_scale one a tensor, X.input_scale read past."""
    path = make_tiny_target(tmp_path / "auto", "llama")
    tensors = load_file(path / "model.safetensors")
    expected = {}
    for name in list(tensors):
        if name.endswith(".weight") and name.split(".")[-2] in LINEAR:
            scale = tensors[name].abs().max() / E4M3_MAX
            tensors[name] = (tensors[name] / scale).to(torch.float8_e4m3fn)
            tensors[name.removesuffix("weight") + "weight_scale"] = scale.reshape(1)
            tensors[name.removesuffix("weight") + "input_scale"] = torch.tensor([0.02])
            expected[name.removeprefix("model.")] = tensors[name].float() * scale
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    (path / "config.json").write_text(json.dumps(cfg))
    model, _ = load_target(path, "cpu", torch.float32)
    params = dict(model.named_parameters())
    assert len(expected) == 14 and all(torch.equal(params[name], w) for name, w in expected.items())


def _qwen3_config() -> dict:
    from helpers import tiny_hf_config

    return tiny_hf_config("qwen3").to_dict()


def test_an_fp8_checkpoint_is_refused_for_tensor_parallelism_before_anything_loads(tmp_path):
    from treeflash.models.parallel import TensorParallelConfigError

    path = make_fp8_target(tmp_path / "fp8", block=(16, 16))
    with pytest.raises(TensorParallelConfigError, match="does not split an FP8 checkpoint"):
        LLM(path, device="cpu", tensor_parallel_size=2)


def test_an_fp8_mixture_of_experts_loads_as_transformers_dequantises_it(tmp_path):
    """Qwen3-MoE's FP8 release quantises every expert's projections, each with its own scales. (Widths that the
    blocks divide: transformers takes a block's size from the grid's shape, which a grid cut short breaks.)"""
    path = make_fp8_target(tmp_path / "fp8", block=(8, 16), arch="qwen3_moe", num_layers=2, num_experts=4,
                           num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    assert any(".experts." in name and name.endswith("_scale_inv") for name in load_file(path / "model.safetensors"))
    ours, _ = load_target(path, "cpu", torch.float32)
    ids = [3, 17, 5, 42, 9, 1, 30]
    with torch.no_grad():
        expected = hf_model(path)(torch.tensor([ids])).logits[0]
    got, _, _ = prefill(ours, ids)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


# --- compressed-tensors (llm-compressor's FP8 releases) ---------------------------------------------------------

def compressed_tensors_config(strategy: str, block: tuple[int, int] | None = None, **weights) -> dict:
    scheme = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": strategy,
              "block_structure": None if block is None else list(block), "group_size": None} | weights
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "kv_cache_scheme": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": scheme,
                                          "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                                                "dynamic": True, "symmetric": True}}}}


def make_compressed_tensors_target(path: Path, strategy: str, block: tuple[int, int] | None = None,
                                   **config) -> Path:
    """A tiny random target stored as llm-compressor stores FP8: X.weight float8 e4m3 and X.weight_scale, one a
    tensor, one an output row or one a block."""
    path = make_tiny_target(path, "llama", **config)
    file = path / "model.safetensors"
    tensors = load_file(file)
    for name in list(tensors):
        if name.endswith(".weight") and name.split(".")[-2] in LINEAR:
            weight = tensors[name]
            scale_name = name.removesuffix("weight") + "weight_scale"
            if strategy == "tensor":
                scale = (weight.abs().max() / E4M3_MAX).reshape(1)
            elif strategy == "channel":
                scale = weight.abs().amax(1, keepdim=True) / E4M3_MAX
            else:
                tensors[name], tensors[scale_name] = quantize(weight, block)
                continue
            tensors[name], tensors[scale_name] = (weight / scale).to(torch.float8_e4m3fn), scale
    save_file(tensors, file, metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = compressed_tensors_config(strategy, block)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path


@pytest.mark.parametrize("strategy, block", [("tensor", None), ("channel", None), ("block", (16, 32))])
def test_compressed_tensors_fp8_weights_are_their_scales_times_their_codes(tmp_path, strategy, block):
    path = make_compressed_tensors_target(tmp_path / "ct", strategy, block, hidden_size=40, num_heads=5,
                                          num_kv_heads=1, head_dim=8, intermediate_size=72)
    model, cfg = load_target(path, "cpu", torch.float32)
    assert cfg.fp8.scale_names == ("weight_scale",) and cfg.fp8.block == block
    raw = load_file(path / "model.safetensors")
    for name, param in model.named_parameters():
        if name.split(".")[-2] in LINEAR:
            weight, scale = raw[f"model.{name}"], raw[f"model.{name}_scale"]
            expected = dequantized_by_loops(weight, scale, block) if block else weight.float() * scale
            assert torch.equal(param, expected), name
        else:
            assert torch.equal(param, raw["lm_head.weight" if name == "lm_head.weight" else f"model.{name}"]), name


def test_a_compressed_tensors_target_decodes_as_its_dequantised_copy(tmp_path):
    """With a KV-cache scheme's k/v scales beside the weights (read past: the cache keeps the engine's dtype)."""
    path = make_compressed_tensors_target(tmp_path / "ct", "channel")
    _edit(path, lambda t: t.update({f"model.layers.{i}.self_attn.{kv}_scale": torch.tensor(0.1)
                                    for i in range(2) for kv in "kv"}))
    plain = tmp_path / "plain"
    plain.mkdir()
    model, _ = load_target(path, "cpu", torch.float32)
    raw = load_file(path / "model.safetensors")
    save_file({f"model.{n}" if n != "lm_head.weight" else n: p.contiguous() for n, p in model.named_parameters()},
              plain / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    del cfg["quantization_config"]
    (plain / "config.json").write_text(json.dumps(cfg))
    up = "model.layers.1.mlp.up_proj.weight"
    assert torch.equal(load_file(plain / "model.safetensors")[up], raw[up].float() * raw[f"{up}_scale"])
    params = SamplingParams(max_tokens=12, temperature=0.0)
    expected = LLM(plain, device="cpu").generate(prompt_token_ids=[[3, 17, 5, 42]], sampling_params=params,
                                                 use_tqdm=False)
    got = LLM(path, device="cpu").generate(prompt_token_ids=[[3, 17, 5, 42]], sampling_params=params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == expected[0].outputs[0].token_ids


@pytest.mark.parametrize("quantization, message", [
    (compressed_tensors_config("group", group_size=32), "weight strategy 'group'"),
    (compressed_tensors_config("channel", num_bits=4, type="int"), "stores 4-bit int weights"),
    (compressed_tensors_config("channel", symmetric=False), "only symmetric 8-bit float weights"),
    (compressed_tensors_config("block"), "the block strategy and no block_structure"),
    (compressed_tensors_config("channel") | {"format": "pack-quantized"}, "format 'pack-quantized'"),
    (compressed_tensors_config("channel") | {"config_groups": {
        "a": compressed_tensors_config("channel")["config_groups"]["group_0"],
        "b": compressed_tensors_config("tensor")["config_groups"]["group_0"]}}, "quantise weights in different ways"),
])
def test_compressed_tensors_schemes_this_engine_does_not_read_are_refused(quantization, message):
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_hf(_qwen3_config() | {"quantization_config": quantization})


def test_a_compressed_tensors_scale_of_the_wrong_shape_is_named(tmp_path):
    path = make_compressed_tensors_target(tmp_path / "ct", "channel")
    _edit(path, lambda t: t.update({"model.layers.0.mlp.down_proj.weight_scale": torch.ones(3, 1)}))
    with pytest.raises(ValueError, match=r"mlp.down_proj.weight: scales \(3, 1\) for a weight \(32, 64\): expected "
                                         r"one a tensor or one a row, \(32, 1\)"):
        LLM(path, device="cpu")

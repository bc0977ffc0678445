"""Checkpoint layouts: sharded safetensors with an index, and what goes wrong with one."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from helpers import hf_model, make_tiny_target, set_config_fields
from treeflash import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPT = [[3, 14, 15, 9, 26]]


@pytest.fixture(scope="module")
def single_and_sharded(tmp_path_factory):
    single = make_tiny_target(tmp_path_factory.mktemp("single"), "qwen3", seed=4)
    sharded = tmp_path_factory.mktemp("sharded")
    hf_model(single).save_pretrained(sharded, max_shard_size="20KB")
    return single, sharded


def test_sharded_checkpoint_loads_and_generates_the_same(single_and_sharded):
    single, sharded = single_and_sharded
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2  # really split
    want = LLM(single).generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0].token_ids
    got = LLM(sharded).generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0].token_ids
    assert got == want


def test_missing_shard_is_named(single_and_sharded, tmp_path):
    _, sharded = single_and_sharded
    broken = shutil.copytree(sharded, tmp_path / "broken")
    shard = sorted(broken.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        LLM(broken)


def test_malformed_index_is_a_clear_error(single_and_sharded, tmp_path):
    _, sharded = single_and_sharded
    broken = shutil.copytree(sharded, tmp_path / "broken")
    (broken / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ValueError, match="malformed safetensors index"):
        LLM(broken)


def test_dtype_and_device_arguments_are_checked(single_and_sharded):
    single, _ = single_and_sharded
    with pytest.raises(ValueError, match="dtype must be one of"):
        LLM(single, dtype="float8")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            LLM(single, device="cuda")
    assert LLM(single, dtype="bfloat16").model.embed_tokens.weight.dtype == torch.bfloat16


def test_chat_input_is_checked(single_and_sharded):
    single, _ = single_and_sharded
    llm = LLM(single)
    for bad in ([], [[]], [{"content": "no role"}], ["just a string"]):
        with pytest.raises(ValueError, match="message|conversation"):
            llm.chat(bad)


# --- found by a review of loading: each of these ran a model other than the one given, or failed deep inside

def greedy_ids(path) -> list[int]:
    return LLM(path, device="cpu").generate(prompt_token_ids=PROMPT, sampling_params=GREEDY,
                                            use_tqdm=False)[0].token_ids


def hf_greedy_ids(path) -> list[int]:
    with torch.no_grad():
        out = hf_model(path).generate(torch.tensor(PROMPT), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                      pad_token_id=0)
    return out[0, len(PROMPT[0]):].tolist()


def test_a_tied_config_with_a_different_shipped_head_runs_that_head_as_transformers_does(tmp_path):
    path = make_tiny_target(tmp_path / "m", "llama", seed=1)  # untied: lm_head != embed_tokens
    set_config_fields(path, tie_word_embeddings=True)
    with pytest.warns(UserWarning, match="lm_head.weight differs from embed_tokens.weight"):
        got = greedy_ids(path)
    assert got == hf_greedy_ids(path)


def test_a_tensor_parallel_rank_checks_whole_shapes(tmp_path):
    from treeflash.checkpoint import load_target
    from treeflash.models.parallel import Communicator, Shard

    path = make_tiny_target(tmp_path / "m", "llama", seed=1)  # intermediate_size 64 in the weights
    set_config_fields(path, intermediate_size=48)
    for shard in (None, Shard(0, 2, Communicator())):  # one rank refused it; a rank's slice passed
        with pytest.raises(ValueError, match="mlp.*proj.weight has shape"):
            load_target(path, "cpu", torch.float32, shard=shard)


def test_without_an_index_model_safetensors_is_the_model_and_a_tensor_in_two_files_is_refused(tmp_path):
    from safetensors.torch import save_file

    path = make_tiny_target(tmp_path / "m", "llama", seed=1)
    want = greedy_ids(path)
    save_file({"model.norm.weight": torch.zeros(32)}, str(path / "zz.safetensors"))  # a stray file beside it
    assert greedy_ids(path) == want  # as transformers reads it: model.safetensors alone
    (path / "model.safetensors").rename(path / "part-a.safetensors")
    with pytest.raises(ValueError, match="model.norm.weight is also in another file"):
        LLM(path, device="cpu")


def test_integer_weights_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    path = make_tiny_target(tmp_path / "m", "llama", seed=1)
    tensors = load_file(path / "model.safetensors")
    key = "model.layers.0.self_attn.q_proj.weight"
    tensors[key] = (tensors[key] * 100).to(torch.int8)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="q_proj.weight is torch.int8"):
        LLM(path, device="cpu")


@pytest.mark.parametrize("index, message", [
    ([1, 2], "malformed safetensors index"),
    ({"weight_map": ["a.safetensors"]}, "weight_map must map tensor names to file names"),
    ({"weight_map": {"model.norm.weight": None}}, "weight_map must map tensor names to file names"),
    ({"weight_map": {"model.norm.weight": "../outside.safetensors"}}, "shards must be files of"),
    ({"weight_map": {"model.norm.weight": "/tmp/x.safetensors"}}, "shards must be files of"),
])
def test_a_malformed_index_is_named(single_and_sharded, tmp_path, index, message):
    _, sharded = single_and_sharded
    broken = shutil.copytree(sharded, tmp_path / "broken")
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=message):
        LLM(broken)


@pytest.mark.parametrize("content, message", [
    (b"{bad", "malformed generation_config.json"),
    (b"[1]", "must hold a JSON object"),
    (b'{"eos_token_id": [[1]]}', "'eos_token_id' must be an integer or a list of integers"),
])
def test_a_malformed_generation_config_is_named(tmp_path, content, message):
    path = make_tiny_target(tmp_path / "m", "llama", seed=1)
    (path / "generation_config.json").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        LLM(path, device="cpu")


def test_malformed_tokenizer_files_are_named(tmp_path):
    path = make_tiny_target(tmp_path / "m", "llama", seed=1, tokenizer=True)
    (path / "tokenizer.json").write_text("{bad")
    with pytest.raises(ValueError, match="cannot load its tokenizer files"):
        LLM(path, device="cpu")


def test_malformed_drafter_configs_are_named(tmp_path):
    from spec_helpers import make_drafter

    target = make_tiny_target(tmp_path / "t", "llama", seed=1)
    drafter = make_drafter(tmp_path / "d", target, block_size=4)
    config = json.loads((drafter / "config.json").read_text())
    for fields, message in (({"architectures": 5}, "not a DFlash drafter"),
                            ({"block_size": 10 ** 9, "dflash_config": {**config.get("dflash_config", {}),
                                                                      "block_size": 10 ** 9}}, "block_size must be in")):
        (drafter / "config.json").write_text(json.dumps({**config, **fields}))
        with pytest.raises(ValueError, match=message):
            LLM(target, draft_model=drafter, device="cpu")
    (drafter / "config.json").write_text(json.dumps(config))
    (drafter / "draft_vocab.json").write_bytes(b'{"token_ids": [\xff]}')
    with pytest.raises(ValueError, match="malformed draft vocabulary"):
        LLM(target, draft_model=drafter, device="cpu")

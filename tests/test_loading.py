"""Checkpoint layouts: sharded safetensors with an index, and what goes wrong with one."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from helpers import hf_model, make_tiny_target
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

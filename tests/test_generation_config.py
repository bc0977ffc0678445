"""A model's own sampling defaults (generation_config.json, treeflash/generation_config.py), as vLLM takes them:
`LLM.generate` without sampling_params, `treeflash generate`'s options left out, and the server's fields a
request leaves out; "vllm" and explicit values keep theirs; a bad file is a clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import make_tiny_target
from treeflash import LLM, SamplingParams
from treeflash.config import ConfigError
from treeflash.generation_config import sampling_defaults

QWEN3 = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
         "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}  # (Qwen3-8B's file)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = make_tiny_target(tmp_path_factory.mktemp("generation-config") / "chars", tokenizer=True)
    (path / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": 7,
                                                             "do_sample": True, "top_k": 5}))
    return path


def test_the_fields_vllm_takes_are_read_and_the_rest_left(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(QWEN3))
    assert sampling_defaults("auto", tmp_path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert sampling_defaults(str(tmp_path), None) == sampling_defaults(str(tmp_path / "generation_config.json"), None)
    assert sampling_defaults("vllm", tmp_path) == {} and sampling_defaults(None, tmp_path) == {}
    assert sampling_defaults("auto", tmp_path / "elsewhere") == {}  # (no file: no defaults)
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 64, "repetition_penalty": 1.05,
                                                                 "min_p": None}))
    assert sampling_defaults("auto", tmp_path) == {"max_tokens": 64, "repetition_penalty": 1.05}


@pytest.mark.parametrize("content, says", [({"top_p": 1.5}, "top_p must be in (0, 1]"),
                                           ({"temperature": "hot"}, "temperature must be a finite number"),
                                           ([1, 2], "must hold a JSON object"), ("{", "malformed")])
def test_a_bad_file_is_an_error_naming_it(tmp_path, content, says):
    (tmp_path / "generation_config.json").write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError, match="generation_config.json") as error:
        sampling_defaults("auto", tmp_path)
    assert says in str(error.value)
    with pytest.raises(ConfigError, match="neither 'auto', 'vllm'"):
        sampling_defaults(str(tmp_path / "missing"), None)


def test_generate_without_sampling_params_takes_the_models_defaults(model_dir):
    llm = LLM(str(model_dir), device="cpu")
    assert llm.default_sampling == {"temperature": 0.0, "top_k": 5, "max_tokens": 7}
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.0, top_k=5, max_tokens=7)
    out = llm.generate(["abc"], use_tqdm=False)[0]
    greedy = llm.generate(["abc"], SamplingParams(temperature=0, max_tokens=7), use_tqdm=False)[0]
    assert out.token_ids == greedy.token_ids
    assert len(out.token_ids) == 7 or out.finish_reason == "stop"
    plain = LLM(str(model_dir), device="cpu", generation_config="vllm")
    assert plain.default_sampling == {} and plain.get_default_sampling_params() == SamplingParams()
    with pytest.raises(ConfigError, match="neither"):
        LLM(str(model_dir), device="cpu", generation_config=str(model_dir / "nothing-here"))


def test_the_command_line_takes_the_models_defaults_under_what_is_asked(model_dir):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "treeflash.cli", "generate", "abc", "--model", str(model_dir),
                               "--device", "cpu", "--ignore-eos", *args], capture_output=True, text=True, timeout=300)

    default = run()
    assert default.returncode == 0, default.stderr
    assert "7 tokens" in default.stderr  # (its max_new_tokens; greedy, so the same text twice)
    assert run().stdout == default.stdout
    assert "3 tokens" in run("--max-tokens", "3").stderr
    assert "16 tokens" in run("--generation-config", "vllm", "--max-tokens", "16").stderr

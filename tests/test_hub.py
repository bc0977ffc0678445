"""Models and drafters named by Hugging Face Hub repository id ("org/name"), as transformers and vLLM take them:
read from the Hugging Face cache (offline here: the cache is written by hand, as a download would leave it)."""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

import pytest

from helpers import make_tiny_target, write_char_tokenizer
from spec_helpers import make_drafter
from treeflash import LLM, SamplingParams

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(cache: Path, repo_id: str, source: Path) -> Path:
    """`source`'s files as the Hub cache holds a downloaded repository: a snapshot per commit, refs/main naming
    it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    shutil.copytree(source, repo / "snapshots" / COMMIT)
    return repo / "snapshots" / COMMIT


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An offline Hugging Face cache of our own (no test may reach the network)."""
    import huggingface_hub.constants as constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_model_and_drafter_named_by_repo_id_load_from_the_cache(tmp_path, hub_cache):
    target = make_tiny_target(tmp_path / "target", "qwen3")
    write_char_tokenizer(target, 64)
    drafter = make_drafter(tmp_path / "drafter", target, block_size=4)
    cache_repo(hub_cache, "tf-test/tiny-target", target)
    cache_repo(hub_cache, "tf-test/tiny-drafter", drafter)
    params = SamplingParams(max_tokens=10, temperature=0.0)
    expected = LLM(target, device="cpu").generate(prompt_token_ids=[[3, 17, 5]], sampling_params=params,
                                                  use_tqdm=False)
    llm = LLM("tf-test/tiny-target", device="cpu", draft_model="tf-test/tiny-drafter", tree_budget=8)
    assert llm.model_dir == hub_cache / "models--tf-test--tiny-target" / "snapshots" / COMMIT
    got = llm.generate(prompt_token_ids=[[3, 17, 5]], sampling_params=params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == expected[0].outputs[0].token_ids
    assert llm.generate("abc", params, use_tqdm=False)[0].outputs[0].text  # the repository's tokenizer


def test_a_repo_id_neither_here_nor_in_the_cache_is_named(hub_cache):
    with pytest.raises(FileNotFoundError, match=r"tf-test/absent: no such model directory here, and no Hugging "
                                                r"Face Hub repository of that name could be fetched"):
        LLM("tf-test/absent", device="cpu")
    with pytest.raises(FileNotFoundError, match="tf-test/absent-drafter: no such drafter directory here"):
        LLM(None, device="cpu", draft_model="tf-test/absent-drafter")


def test_a_directory_of_that_name_wins(tmp_path, hub_cache, monkeypatch):
    """As in transformers: "org/name" that exists here is the local directory, not the Hub's."""
    monkeypatch.chdir(tmp_path)
    make_tiny_target(tmp_path / "tf-test" / "local", "qwen3")
    assert LLM("tf-test/local", device="cpu").model_dir.resolve() == (tmp_path / "tf-test" / "local").resolve()


class FakeHub:
    """snapshot_download over a listing of a repository's files: writes the files the patterns allow into one
    snapshot folder and keeps what each call fetched."""

    def __init__(self, root: Path, files: dict[str, str]):
        self.root, self.files, self.fetched, self.revisions = root, files, [], set()

    def snapshot_download(self, repo_id, allow_patterns, revision=None):
        self.revisions.add(revision)
        chosen = [n for n in self.files if any(fnmatch.fnmatch(n, p) for p in allow_patterns)]
        for name in chosen:
            (self.root / name).write_text(self.files[name])
        self.fetched += chosen
        return str(self.root)


INDEX = json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
SAFE = {"config.json": "{}", "generation_config.json": "{}", "tokenizer.json": "{}", "tokenizer_config.json": "{}",
        "chat_template.jinja": "", "merges.txt": "", "tokenizer.model": ""}
UNSAFE = {"pytorch_model.bin": "", "training_args.bin": "", "consolidated.pth": "", "modeling_custom.py": "",
          "model.gguf": ""}


@pytest.mark.parametrize("weights, fetched", [
    ({"model.safetensors.index.json": INDEX, "model-00001-of-00002.safetensors": "",
      "model-00002-of-00002.safetensors": "", "consolidated.safetensors": ""},
     ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]),
    ({"model.safetensors": "", "consolidated.safetensors": ""}, ["model.safetensors"]),
    ({"consolidated.safetensors": ""}, ["consolidated.safetensors"]),
])
def test_only_the_weights_read_and_no_pickle_or_code_are_fetched(tmp_path, monkeypatch, weights, fetched):
    """The index's shards, else model.safetensors, else every safetensors file (as safetensors_files reads them);
    never a pickle (which this engine does not unpickle) nor code (which it does not run)."""
    import huggingface_hub

    from treeflash.checkpoint import from_hub

    hub = FakeHub(tmp_path, SAFE | UNSAFE | weights)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
    assert from_hub("tf-test/listing") == tmp_path
    assert sorted(set(hub.fetched)) == sorted(set(SAFE) | set(fetched))


def greedy_tokens(model) -> list[int]:
    params = SamplingParams(max_tokens=8, temperature=0.0)
    out = LLM(model, device="cpu").generate(prompt_token_ids=[[3, 17, 5]], sampling_params=params, use_tqdm=False)
    return out[0].outputs[0].token_ids


def test_a_gguf_file_of_a_hub_repository_loads_from_the_cache(tmp_path, hub_cache, monkeypatch):
    """"org/name/file.gguf": that file of the repository (a GGUF repository holds one per quantisation)."""
    from test_gguf import tiny_model, write_gguf

    monkeypatch.setenv("TREEFLASH_CACHE", str(tmp_path / "treeflash-cache"))
    source = tmp_path / "repo"
    source.mkdir()
    write_gguf(source / "tiny-F32.gguf", tiny_model("llama"), "llama")
    cache_repo(hub_cache, "tf-test/tiny-GGUF", source)
    assert greedy_tokens("tf-test/tiny-GGUF/tiny-F32.gguf") == greedy_tokens(source / "tiny-F32.gguf")
    with pytest.raises(FileNotFoundError, match="tf-test/tiny-GGUF/tiny-Q4_K_M.gguf: no such GGUF file here"):
        LLM("tf-test/tiny-GGUF/tiny-Q4_K_M.gguf", device="cpu")


def test_a_revision_reaches_every_fetch_and_is_said_to_be_ignored_for_a_local_model(tmp_path, monkeypatch):
    import huggingface_hub

    from treeflash.checkpoint import resolve_model_dir

    hub = FakeHub(tmp_path / "snapshot", SAFE | {"model.safetensors": ""})
    hub.root.mkdir()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
    assert resolve_model_dir("tf-test/listing", revision="v1.0") == hub.root
    assert hub.revisions == {"v1.0"}
    local = make_tiny_target(tmp_path / "local", "qwen3")
    with pytest.warns(UserWarning, match=f"revision='v1.0' is ignored: .*{local} is not one"):
        assert resolve_model_dir(local, revision="v1.0") == local


def test_a_gguf_repository_by_quantisation_tag(tmp_path, hub_cache, monkeypatch):
    """"org/name:Q4_K_M", as llama.cpp's -hf takes one: the repository's one GGUF file whose name holds the tag (any
    case; a vision projector's left out); none, several, or a split file are named."""
    from test_gguf import tiny_model, write_gguf

    monkeypatch.setenv("TREEFLASH_CACHE", str(tmp_path / "treeflash-cache"))
    source = tmp_path / "repo"
    source.mkdir()
    write_gguf(source / "tiny-Q8_0.gguf", tiny_model("llama"), "llama")
    for name in ("mmproj-tiny-Q8_0.gguf", "tiny-F16.gguf", "tiny-F16-v2.gguf", "big-Q2_K-00001-of-00002.gguf",
                 "big-Q2_K-00002-of-00002.gguf"):
        (source / name).write_bytes(b"GGUF")
    cache_repo(hub_cache, "tf-test/tiny-GGUF", source)
    assert greedy_tokens("tf-test/tiny-GGUF:q8_0") == greedy_tokens(source / "tiny-Q8_0.gguf")
    with pytest.raises(FileNotFoundError, match="no GGUF file of the repository names 'Q4_K_M'"):
        LLM("tf-test/tiny-GGUF:Q4_K_M", device="cpu")
    with pytest.raises(FileNotFoundError, match=r"2 GGUF files name 'F16' \(tiny-F16-v2.gguf, tiny-F16.gguf\); "
                                                r"name one as tf-test/tiny-GGUF/FILE.gguf"):
        LLM("tf-test/tiny-GGUF:F16", device="cpu")
    from treeflash.config import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="one part of a split GGUF"):
        LLM("tf-test/tiny-GGUF:Q2_K", device="cpu")

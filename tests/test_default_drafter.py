"""The shipped drafter of the embedded default pair (SmolLM2-135M-Instruct + treeflash/default_drafter):
it is package data, it fits the target, it is what `LLM()` uses, and it really drafts (more than one
token per round), losslessly."""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path

import pytest

from treeflash import LLM, SamplingParams
from treeflash.config import read_config_json
from treeflash.default_model import DEFAULT_DRAFTER_DIR, default_draft_model
from treeflash.models.dflash import DrafterConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]
CHATS = ["Write a Python function that reverses a string.", "What is the capital of France?",
         "Give me three tips for learning to cook."]


def test_shipped_files_are_small_and_package_data():
    index = json.loads((DEFAULT_DRAFTER_DIR / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    sizes = [(DEFAULT_DRAFTER_DIR / s).stat().st_size for s in shards]
    assert all(size < 16 * 2**20 for size in sizes) and sum(sizes) <= 32_000_000
    cfg = DrafterConfig.from_hf(read_config_json(DEFAULT_DRAFTER_DIR))
    assert 3 <= cfg.mask_token_id <= 16  # one of SmolLM2's unused special tokens
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["treeflash"]
    for f in DEFAULT_DRAFTER_DIR.iterdir():
        rel = f"default_drafter/{f.name}"
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} would be missing from a non-editable install"


def test_default_drafter_only_for_the_default_target():
    assert default_draft_model(None, None, None) == DEFAULT_DRAFTER_DIR
    assert default_draft_model(None, None, "dflash") == DEFAULT_DRAFTER_DIR
    assert default_draft_model(None, None, "none") is None
    assert default_draft_model("some/model", None, None) is None
    assert default_draft_model(None, "my/drafter", None) == "my/drafter"


@pytest.mark.integration
@pytest.mark.slow
def test_default_pair_drafts_more_than_one_token_per_round_losslessly():
    pair = LLM(tree_budget=16)  # no model, no drafter: the embedded pair, DDTree
    assert pair.spec.method == "ddtree" and pair.drafter is not None
    pair.drafter.config.check_target(pair.config)
    plain = LLM(spec="none")
    assert plain.drafter is None
    greedy = SamplingParams(temperature=0, max_tokens=48)
    conversations = [[{"role": "user", "content": c}] for c in CHATS]
    drafted, reference = pair.chat(conversations, greedy), plain.chat(conversations, greedy)
    assert [o.token_ids for o in drafted] == [o.token_ids for o in reference]
    lengths = [a for o in drafted for a in o.metrics.acceptance_lengths]
    assert sum(lengths) / len(lengths) > 1.2  # a random drafter stays at ~1.0


@pytest.mark.reference
def test_reference_package_loads_the_shipped_drafter():
    import torch
    from dflash.model import DFlashDraftModel

    from treeflash.checkpoint import load_drafter

    ref = DFlashDraftModel.from_pretrained(str(DEFAULT_DRAFTER_DIR), dtype=torch.float32)
    ours = load_drafter(DEFAULT_DRAFTER_DIR, "cpu", torch.float32)
    assert ref.block_size == ours.config.block_size and ref.mask_token_id == ours.config.mask_token_id
    assert list(ref.target_layer_ids) == list(ours.config.target_layer_ids)
    ref_weights = ref.state_dict()
    for name, p in ours.named_parameters():
        assert torch.equal(ref_weights[name], p), name

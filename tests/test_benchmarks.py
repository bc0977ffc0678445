"""The benchmark scripts run end to end on the CPU with a tiny model (their numbers come from a GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import make_tiny_target, one_thread

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bf16_identity  # noqa: E402
import sampler_cost  # noqa: E402


def test_first_divergence():
    assert bf16_identity.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert bf16_identity.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert bf16_identity.first_divergence([1, 2], [1, 2, 3]) == 2


def test_bf16_identity_writes_its_report(tmp_path):
    model = make_tiny_target(tmp_path / "m", "qwen3", vocab_size=64, seed=2, tokenizer=True)
    out = tmp_path / "bf16.json"
    with one_thread():
        bf16_identity.main(["--model", str(model), "--device", "cpu", "--dtypes", "bfloat16,float32",
                            "--prompts", "3", "--prompt-set", "builtin", "--max-tokens", "6", "--batch", "2",
                            "--tree-budget", "4", "--block-size", "4", "--out", str(out)])
    report = json.loads(out.read_text())
    for key in ("command", "git_commit", "date", "device", "torch", "drafter"):
        assert report[key]
    assert report["prompt_set"] == "builtin" and report["prompts"] == 3
    for dtype in ("bfloat16", "float32"):
        comparisons = report[dtype]["comparisons"]
        assert set(comparisons) == {"none-b1 vs none-b2", "none-b1 vs ddtree-b1", "none-b1 vs ddtree-b2"}
        for c in comparisons.values():
            assert len(c["first_divergence"]) == 3 and 0 <= c["fraction_differing"] <= 1
    # float32 is token-identical whatever the batch and method.
    assert all(c["prompts_differing"] == 0 for c in report["float32"]["comparisons"].values())


def test_sampler_cost_runs(tmp_path):
    out = tmp_path / "cost.json"
    with one_thread():
        sampler_cost.main(["--device", "cpu", "--rows", "2", "--vocab", "5000", "--repeats", "1", "--out", str(out)])
    assert set(json.loads(out.read_text())["median_ms"]) == {"softmax", "float32_cdf", "float64_cdf", "two_level",
                                                             "exp_race"}

"""The benchmark scripts run end to end on the CPU with a tiny model (their numbers come from a GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import make_tiny_target, one_thread

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bf16_identity  # noqa: E402
import marginal_oracle  # noqa: E402
import oracle_acceptance  # noqa: E402
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
                                                             "block_sums", "block_sums_torch", "exp_race"}


def test_kernel_profile_runs_on_the_cpu(tmp_path, monkeypatch):
    # On the CPU it lists operators instead of kernels: enough to check the script end to end.
    import kernel_profile
    from treeflash.bench.shapes import SHAPES, Shape

    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    monkeypatch.setitem(SHAPES, "tiny", Shape("tiny", config, mask_token_id=5, drafter_layers=1, block_size=4))
    out = tmp_path / "prof.txt"
    with one_thread():
        assert kernel_profile.main(["--device", "cpu", "--shape", "tiny", "--methods", "none,ddtree:4",
                                    "--modes", "eager", "--context", "8", "--rounds", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "== none batch 1 eager default attention" in text and "== ddtree:4 batch 1 eager" in text


def test_oracle_bound_is_the_most_probable_paths_by_enumeration(tmp_path):
    import itertools

    import torch
    import transformers

    model_dir = make_tiny_target(tmp_path / "m", "llama", vocab_size=3, seed=4, logit_scale=3.0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    context, budget, temperature = [0, 2, 1], 6, 1.3

    def path_prob(path):  # P(path | context) by full forwards, one token at a time
        prob, seq = 1.0, list(context)
        for t in path:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
            prob *= torch.softmax(logits / temperature, -1)[t].item()
            seq.append(t)
        return prob

    # The best 6-node set is prefix-closed, so its paths are 6 tokens deep at most.
    every = sorted((path_prob(p) for d in range(1, budget + 1) for p in itertools.product(range(3), repeat=d)),
                   reverse=True)
    with one_thread():
        got = oracle_acceptance.best_tree_masses(model, context, temperature, budget)
    assert len(got) == budget
    assert all(abs(a - b) < 1e-5 for a, b in zip(got, every[:budget]))


def test_tree_acceptance_is_what_the_walk_accepts():
    """Greedy: the walk's accepted count; sampling: the expected count, found here by recursion over children."""
    import torch

    import tree_temperature
    from treeflash.tree import build_tree, walk

    g = torch.Generator().manual_seed(0)
    vocab = 6
    draft = torch.log_softmax(torch.randn(1, 4, vocab, generator=g), dim=-1)
    tree = build_tree(torch.tensor([0]), draft, budget=9)
    logits = 2 * torch.randn(1, tree.size, vocab, generator=g)
    assert tree_temperature.tree_acceptance(tree, logits, 0.0) == float(walk(tree, logits.argmax(-1)).accepted[0])

    probs = torch.softmax(logits[0] / 0.7, dim=-1)
    parents, tokens = tree.parents[0].tolist(), tree.tokens[0].tolist()

    def expected(node: int) -> float:  # tokens emitted from `node` on: itself, then its matching child's share
        return 1.0 + sum(float(probs[node, tokens[c]]) * expected(c) for c in range(1, tree.size)
                         if parents[c] == node and tree.valid[0, c])

    assert abs(tree_temperature.tree_acceptance(tree, logits, 0.7) - expected(0)) < 1e-5


def test_marginal_oracle_pieces(tmp_path):
    """The marginals' estimate is each depth's token frequencies; the path tree holds the most frequent
    prefixes, parents first; the sampler is the target's (at a vanishing temperature: its greedy path)."""
    import torch
    import transformers

    samples = torch.tensor([[1, 2], [1, 3], [1, 2], [0, 2]])
    freq = marginal_oracle.marginal_log_probs(samples, 4).exp()[0]
    assert torch.allclose(freq, torch.tensor([[0.25, 0.75, 0, 0], [0, 0, 0.75, 0.25]]), atol=1e-6)

    tree = marginal_oracle.path_tree(torch.tensor([5]), samples, budget=3)  # counts 3, 2, then 1s: shorter first
    assert tree.tokens[0].tolist() == [5, 1, 0, 2] and tree.parents[0].tolist() == [0, 0, 0, 1]
    assert tree.depths[0].tolist() == [0, 1, 1, 2] and tree.valid[0].all() and tree.max_depth == 2
    padded = marginal_oracle.path_tree(torch.tensor([5]), samples, budget=8)  # only 5 distinct prefixes
    assert padded.valid[0].tolist() == [True] * 6 + [False] * 3

    model_dir = make_tiny_target(tmp_path / "m", "llama", vocab_size=16, seed=2, logit_scale=3.0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    context = [3, 1, 4, 1, 5]
    with torch.inference_mode(), one_thread():
        got = marginal_oracle.sample_continuations(model, context, 3, 4, 1e-4, torch.Generator().manual_seed(0))
        greedy = model.generate(torch.tensor([context]), do_sample=False, max_new_tokens=4)[0, len(context):]
    assert got.shape == (3, 4) and all(row == greedy.tolist() for row in got.tolist())


def test_the_admission_profile_runs_every_variant(tmp_path):
    """benchmarks/admission/admission_profile.py on the CPU (its step marks and graph timings need CUDA)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "admission"))
    import admission_profile

    import treeflash.round
    from treeflash.transfer import to_device

    out = tmp_path / "adm.json"
    with one_thread():
        result = admission_profile.main(["--device", "cpu", "--spec", "ddtree:4", "--prompt-len", "8",
                                         "--max-tokens", "3", "--requests", "1", "--out", str(out)])
    assert treeflash.round.to_device is to_device  # the variants' copies swapped back
    assert [r["variant"] for r in result["rows"]] == ["default", "pageable", "dense"]
    assert all(r["admit_ms"] > 0 and r["request_ms"] > 0 for r in result["rows"])
    assert json.loads(out.read_text()) == result


def test_capture_cost_runs_on_the_cpu(tmp_path):
    # On the CPU nothing is captured (rounds run eagerly); the script still builds its random checkpoint from
    # a config-and-tokenizer directory and writes its report, with the profile's summary.
    import capture_cost

    model = make_tiny_target(tmp_path / "m", "llama", vocab_size=64, seed=2, tokenizer=True)
    (model / "model.safetensors").unlink()  # only the shape and the tokenizer are read
    out = tmp_path / "cost.json"
    with one_thread():
        assert capture_cost.main(["--model", str(model), "--random-weights", "--max-num-seqs", "2",
                                  "--max-model-len", "64", "--sampling", "greedy,top_p", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["graphs"] == 0 and report["captures"] == [] and report["command"]
    assert set(report["profile"]) >= {"wall_s", "triton_ptxas", "capture", "budget_measure"}
    assert (tmp_path / "cost.txt").read_text().strip()


def test_stage_kernels_puts_a_rounds_operators_in_its_stages(tmp_path, monkeypatch):
    # On the CPU it counts the operators each stage calls (no kernels there): enough to check the script end to end.
    import stage_kernels
    from treeflash import round as round_module
    from treeflash.bench.shapes import SHAPES, Shape

    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    monkeypatch.setitem(SHAPES, "tiny", Shape("tiny", config, mask_token_id=5, drafter_layers=1, block_size=4))
    clock = round_module.StageClock
    out = tmp_path / "stages.txt"
    with one_thread():
        assert stage_kernels.main(["--device", "cpu", "--shape", "tiny", "--methods", "none,ddtree:4",
                                   "--context", "8", "--rounds", "2", "--out", str(out)]) == 0
    assert round_module.StageClock is clock  # put back
    text = out.read_text()
    assert "== ddtree:4 batch 1 context 8 tiny (eager rounds)" in text
    for stage in ("draft", "tree", "verify", "derive_walk", "commit"):
        assert f"-- {stage}: " in text.split("== ddtree:4")[1], stage

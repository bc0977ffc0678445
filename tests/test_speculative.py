"""Losslessness of speculative rounds: greedy token identity and the exact law of sampled tokens.

Greedy: every spec / budget / block size / batch mix gives the tokens of plain autoregressive greedy
decoding (ours with spec="none", and transformers' generate). Random drafters accept little, so an
"oracle" drafter that knows the greedy continuation also drives deep acceptance and KV compaction.

Sampling: the joint law of the first three tokens emitted by rounds is compared, by a chi-square
test, with the exact product of the target's processed conditionals; the same test must fail for a
reused coin, a relaxed acceptance and a duplicate sibling, or it would prove nothing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

import treeflash.round as round_module
import treeflash.sampling as sampling_module
from treeflash.checkpoint import load_target
from treeflash.llm import LLM
from treeflash.models.dflash import DFlashDrafter, DrafterConfig
from treeflash.round import SpecConfig, Speculator, rows_per_round
from treeflash.sampling import SamplingParams, SamplingTensors, processed_probs
from treeflash.tree import Walk

from spec_helpers import (chi_square, drafter_hf_config, first_emitted, hf_greedy, install_oracle, load_hf,
                          make_drafter, make_target)

# ==================================================================================================
# Greedy losslessness
# ==================================================================================================
TARGETS = {  # name -> make_target kwargs
    "qwen3-64": dict(arch="qwen3", vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, init_std=0.1, seed=1),
    "llama-97": dict(arch="llama", vocab=97, hidden=48, layers=3, heads=4, kv_heads=2, intermediate=96,
                     init_std=0.08, seed=2),
    "qwen3-300-tied": dict(arch="qwen3", vocab=300, hidden=32, layers=2, heads=2, kv_heads=1, init_std=0.1,
                           seed=3, tie=True),
    # A mixture of experts (8, two per token): routing is part of what the verify pass must get right.
    "qwen3moe-80": dict(arch="qwen3_moe", vocab=80, hidden=32, layers=2, heads=4, kv_heads=2, init_std=0.1,
                        seed=4, experts=8),
    "mixtral-72": dict(arch="mixtral", vocab=72, hidden=32, layers=2, heads=4, kv_heads=2, init_std=0.1,
                       seed=5, experts=6),
    # Sliding windows shorter than the longest prompt and its tokens: a tree's nodes see their own windows.
    "mistral-70-window": dict(arch="mistral", vocab=70, hidden=32, layers=2, heads=4, kv_heads=2, init_std=0.1,
                              seed=6, window=7),
    # GPT-OSS: a window on layer 0, attention sinks, biased experts with the clamped SwiGLU, YaRN by default.
    "gptoss-66": dict(arch="gpt_oss", vocab=66, hidden=32, layers=2, heads=4, kv_heads=2, init_std=0.1,
                      seed=7, experts=6, window=6),
    # SmolLM3: layer 0 without rotary embeddings (NoPE) and with a window; layer 1 rotated, whole context.
    "smollm3-68": dict(arch="smollm3", vocab=68, hidden=32, layers=2, heads=4, kv_heads=2, init_std=0.1,
                       seed=8, window=6),
    # Phi-3: fused projections, half of each head rotated (LongRoPE's short factors), a window on every layer.
    "phi3-62": dict(arch="phi3", vocab=62, hidden=32, layers=2, heads=2, kv_heads=1, init_std=0.1, seed=9,
                    window=9),
    # Gemma 3: (1 + w) norms around attention and MLP, a scaled embedding, GELU; a window and its own RoPE on layer 0.
    "gemma3-70": dict(arch="gemma3", vocab=70, hidden=32, layers=2, heads=4, kv_heads=2, init_std=0.1, seed=10,
                      tie=True, window=7),
}
PROMPTS = [[5, 9, 2], [11], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], [7, 7, 8, 20, 13, 6, 1], [30, 2, 17, 4, 44]]
MAX_TOKENS = [24, 9, 30, 17, 1]


class Models:
    """Targets, drafters and autoregressive references, built once per test session, on demand."""

    def __init__(self, root: Path):
        self.root = root
        self.refs: dict[str, list[list[int]]] = {}

    def target(self, name: str) -> Path:
        path = self.root / name
        if not (path / "config.json").is_file():
            make_target(path, **TARGETS[name])
        return path

    def drafter(self, target: str, block_size: int, layers: int = 1, seed: int = 0) -> Path:
        path = self.root / f"{target}-drafter-b{block_size}-l{layers}-s{seed}"
        if not (path / "config.json").is_file():
            ids = None if layers == 1 else list(range(layers))
            make_drafter(path, self.target(target), block_size, seed=seed, layers=layers, target_layer_ids=ids)
        return path

    def reference(self, name: str) -> list[list[int]]:
        """spec="none" greedy outputs of PROMPTS, checked once against transformers' generate."""
        if name not in self.refs:
            outs = run_llm(self.target(name), None, "none", 64, PROMPTS, greedy_params(), max_num_seqs=2)
            ours = [o.token_ids for o in outs]
            hf = load_hf(self.target(name))
            theirs = [hf_greedy(hf, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]
            assert ours == theirs, f"{name}: spec='none' differs from transformers generate(do_sample=False)"
            self.refs[name] = ours
        return self.refs[name]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    return Models(tmp_path_factory.mktemp("spec_models"))


def greedy_params(max_tokens=MAX_TOKENS) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens]


def run_llm(target: Path, drafter: Path | None, spec: str, budget: int, prompts, params, max_num_seqs=3):
    llm = LLM(str(target), device="cpu", dtype="float32", draft_model=str(drafter) if drafter else None,
              spec=spec, tree_budget=budget, max_num_seqs=max_num_seqs)
    return llm.generate(prompt_token_ids=prompts, sampling_params=params)


def mean_acceptance(outputs) -> float:
    lengths = [a for o in outputs for a in o.metrics.acceptance_lengths]
    return sum(lengths) / len(lengths)


GREEDY_CASES = [  # target, spec, budget, block size, drafter layers, max_num_seqs
    ("qwen3-64", "dflash", 0, 4, 1, 2),
    ("qwen3-64", "ddtree", 1, 8, 1, 3),
    ("qwen3-64", "ddtree", 4, 4, 2, 2),
    ("qwen3-64", "ddtree", 16, 16, 1, 4),
    ("llama-97", "ddtree", 64, 8, 1, 3),
    ("llama-97", "dflash", 0, 16, 2, 2),
    ("qwen3-300-tied", "ddtree", 16, 8, 1, 2),
    ("qwen3-300-tied", "dflash", 0, 8, 1, 5),
    ("qwen3moe-80", "ddtree", 16, 8, 1, 3),
    ("qwen3moe-80", "dflash", 0, 4, 2, 2),
    ("mixtral-72", "ddtree", 32, 8, 1, 3),
    ("mistral-70-window", "ddtree", 16, 8, 1, 3),
    ("gptoss-66", "ddtree", 32, 8, 1, 3),
    ("gptoss-66", "dflash", 0, 4, 1, 2),
    ("smollm3-68", "ddtree", 16, 8, 1, 3),
    ("phi3-62", "ddtree", 16, 8, 1, 3),
    ("phi3-62", "dflash", 0, 4, 1, 2),
    ("gemma3-70", "ddtree", 16, 8, 1, 3),
    ("gemma3-70", "dflash", 0, 4, 1, 2),
]


@pytest.mark.parametrize("target,spec,budget,block,layers,max_num_seqs", GREEDY_CASES)
def test_greedy_identical_random_drafter(models, target, spec, budget, block, layers, max_num_seqs):
    ref = models.reference(target)
    outs = run_llm(models.target(target), models.drafter(target, block, layers), spec, budget or 64,
                   PROMPTS, greedy_params(), max_num_seqs=max_num_seqs)
    assert [o.token_ids for o in outs] == ref
    assert [o.finish_reason for o in outs] == ["length"] * len(PROMPTS)


# --- the oracle drafter -----------------------------------------------------------------------------
def count_side_branches(monkeypatch) -> dict[str, int]:
    """Count accepted nodes (of running slots) that have an earlier valid sibling: paths that leave
    the first child, so the kept KV rows are not a prefix of the tree's rows."""
    stats = {"taken": 0}
    original = Speculator.round

    def counting_round(self, num_slots, *args, **kwargs):
        result = original(self, num_slots, *args, **kwargs)
        tree, w = result.tree, result.walk
        idx = torch.arange(tree.size)
        same_parent = tree.parents[:, :, None] == tree.parents[:, None, :]
        earlier = same_parent & tree.valid[:, None, :] & (idx[None, None, :] < idx[None, :, None]) & (idx > 0)
        has_earlier = earlier.any(-1) & (idx > 0)
        on_path = torch.zeros_like(tree.valid).scatter_(1, w.path, True)
        running = self.state.active[:num_slots, None]
        stats["taken"] += int((on_path & has_earlier & running).sum())
        return result

    monkeypatch.setattr(Speculator, "round", counting_round)
    return stats


ORACLE_CASES = [  # target, spec, budget, block size, max_num_seqs, decoy rate
    ("qwen3-64", "ddtree", 16, 8, 3, 0.3),
    ("qwen3-64", "ddtree", 4, 4, 2, 0.3),
    ("qwen3-64", "dflash", 0, 16, 2, 0.1),
    ("llama-97", "ddtree", 64, 16, 4, 0.4),
    ("llama-97", "dflash", 0, 8, 3, 0.1),
    ("qwen3-300-tied", "ddtree", 8, 8, 2, 0.5),
    ("qwen3moe-80", "ddtree", 16, 8, 3, 0.3),
    ("mixtral-72", "ddtree", 16, 8, 2, 0.3),
    ("mistral-70-window", "ddtree", 16, 8, 2, 0.3),
    ("gptoss-66", "ddtree", 16, 8, 3, 0.3),
    ("smollm3-68", "ddtree", 16, 8, 2, 0.3),
    ("phi3-62", "ddtree", 16, 8, 2, 0.3),
    ("gemma3-70", "ddtree", 16, 8, 2, 0.3),
]


@pytest.mark.parametrize("target,spec,budget,block,max_num_seqs,decoys", ORACLE_CASES)
def test_greedy_identical_oracle_drafter(models, monkeypatch, target, spec, budget, block, max_num_seqs, decoys):
    ref = models.reference(target)
    known = {tuple(p): p + r for p, r in zip(PROMPTS, ref)}
    install_oracle(monkeypatch, known, TARGETS[target]["vocab"], decoy_rate=decoys)
    side_branches = count_side_branches(monkeypatch)
    outs = run_llm(models.target(target), models.drafter(target, block), spec, budget or 64, PROMPTS,
                   greedy_params(), max_num_seqs=max_num_seqs)
    assert [o.token_ids for o in outs] == ref
    tau = mean_acceptance(outs)
    print(f"oracle {target} {spec} budget {budget} block {block}: mean acceptance length {tau:.2f}")
    assert tau > 2.0, f"the oracle should be accepted deeply, mean acceptance length {tau:.2f}"
    if spec == "ddtree":
        assert side_branches["taken"] > 0, "decoys should make some accepted paths leave the first child"


@pytest.mark.parametrize("spec,budget", [("ddtree", 16), ("dflash", 0)])
def test_stop_token_inside_accepted_path(models, monkeypatch, spec, budget):
    ref = models.reference("qwen3-64")
    prompt, greedy = PROMPTS[2], ref[2]  # 30 greedy tokens
    # A stop token that first appears mid-sequence (not at the very first token).
    k = next(i for i in range(4, len(greedy)) if greedy[i] not in greedy[:i] and i % 8 != 0)
    stop = greedy[k]
    install_oracle(monkeypatch, {tuple(prompt): prompt + greedy}, 64, decoy_rate=0.0)
    params = [SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[stop], ignore_eos=True)]
    out = run_llm(models.target("qwen3-64"), models.drafter("qwen3-64", 8), spec, budget or 64, [prompt], params)[0]
    assert out.token_ids == greedy[:k + 1]
    assert out.finish_reason == "stop"
    rounds = out.metrics.acceptance_lengths
    assert max(rounds) >= 4, "the oracle must make multi-token rounds"
    # Rounds count what they emitted (the first token is prefill's), and the stop token cut the last one
    # short of the oracle's full rounds: it was inside an accepted path.
    assert 1 + sum(rounds) == len(out.token_ids)
    assert rounds[-1] < 8  # the oracle's rounds emit a whole block of 8 until the stop


@pytest.mark.parametrize("spec,budget", [("ddtree", 16), ("dflash", 0)])
def test_acceptance_lengths_count_what_rounds_emitted_when_max_tokens_cuts_a_round(models, monkeypatch, spec,
                                                                                  budget):
    # Metrics' tokens per round are emitted tokens: a round cut by max_tokens counts what it kept (the
    # oracle's rounds are whole 8-token blocks, so 13 tokens = prefill's 1 + 8 + 4 of the next 8).
    ref = models.reference("qwen3-64")
    prompt, greedy = PROMPTS[2], ref[2]
    install_oracle(monkeypatch, {tuple(prompt): prompt + greedy}, 64, decoy_rate=0.0)
    params = [SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True)]
    out = run_llm(models.target("qwen3-64"), models.drafter("qwen3-64", 8), spec, budget or 64, [prompt], params)[0]
    assert out.token_ids == greedy[:13] and out.finish_reason == "length"
    assert out.metrics.acceptance_lengths == [8, 4]
    assert out.metrics.mean_acceptance_length == 6.0


@pytest.mark.parametrize("spec,budget", [("ddtree", 16), ("dflash", 0)])
def test_stop_string_inside_accepted_path(tmp_path, monkeypatch, spec, budget):
    """A stop string completed in the middle of a multi-token round: text and tokens cut exactly there."""
    from helpers import char_text, make_tiny_target

    target = make_tiny_target(tmp_path / "text-target", "qwen3", vocab_size=64, seed=11, tokenizer=True)
    drafter = make_drafter(tmp_path / "text-drafter", target, 8)
    prompt = "the quick brown fox"
    plain = LLM(str(target), device="cpu")
    free = plain.generate(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    text = char_text(free.token_ids)
    start = next(j for j in range(6, len(text) - 2) if text[j:j + 2] not in text[:j + 1] and j % 7)
    stop = text[start:start + 2]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=["zzzz", stop])
    want = plain.generate(prompt, params)[0]
    assert want.finish_reason == "stop" and want.text == text[:start]
    install_oracle(monkeypatch, {tuple(free.prompt_token_ids): free.prompt_token_ids + free.token_ids}, 64,
                   decoy_rate=0.0)
    out = LLM(str(target), device="cpu", draft_model=str(drafter), spec=spec, tree_budget=budget or 64).generate(
        prompt, params)[0]
    assert (out.text, out.token_ids, out.finish_reason) == (want.text, want.token_ids, "stop")
    rounds = out.metrics.acceptance_lengths
    assert 1 + sum(rounds) == len(out.token_ids)  # what rounds emitted, not what they accepted
    assert rounds[-1] < max(rounds[:-1]), "the stop must fall inside a round (and cut it short)"


# --- mixed batches and seeds --------------------------------------------------------------------------
MIXED_PROMPTS = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3], PROMPTS[4], [8, 8, 8]]
MIXED_PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
    SamplingParams(temperature=0.8, max_tokens=15, seed=7, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
    SamplingParams(temperature=1.0, top_k=10, top_p=0.9, max_tokens=25, seed=11, ignore_eos=True),
    SamplingParams(temperature=0.6, min_p=0.1, max_tokens=12, seed=3, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=11, ignore_eos=True),
]


@pytest.mark.parametrize("spec,budget,oracle", [("ddtree", 16, False), ("ddtree", 16, True), ("dflash", 0, True),
                                                ("none", 0, False)])
def test_mixed_batch_greedy_and_seeded_sampling(models, monkeypatch, spec, budget, oracle):
    target = models.target("qwen3-64")
    drafter = models.drafter("qwen3-64", 8) if spec != "none" else None
    # Autoregressive greedy references (spec="none", itself checked against transformers).
    greedy = [i for i, p in enumerate(MIXED_PARAMS) if p.greedy]
    outs = run_llm(target, None, "none", 64, [MIXED_PROMPTS[i] for i in greedy], [MIXED_PARAMS[i] for i in greedy])
    greedy_ref = {i: o.token_ids for i, o in zip(greedy, outs)}
    assert greedy_ref[0] == models.reference("qwen3-64")[0][:MIXED_PARAMS[0].max_tokens]
    if oracle:
        known = {tuple(MIXED_PROMPTS[i]): MIXED_PROMPTS[i] + greedy_ref[i] for i in greedy_ref}
        install_oracle(monkeypatch, known, 64, decoy_rate=0.2)

    batch = run_llm(target, drafter, spec, budget or 64, MIXED_PROMPTS, MIXED_PARAMS, max_num_seqs=3)
    for i, ref in greedy_ref.items():
        assert batch[i].token_ids == ref, f"greedy request {i} differs from autoregressive greedy"
    assert [len(o.token_ids) for o in batch] == [p.max_tokens for p in MIXED_PARAMS]
    if oracle:
        assert mean_acceptance([batch[i] for i in greedy_ref]) > 2.0
    # Seeded sampled requests: the same tokens alone, in the reversed batch, with other batch sizes.
    order = list(reversed(range(len(MIXED_PARAMS))))
    reversed_batch = run_llm(target, drafter, spec, budget or 64, [MIXED_PROMPTS[i] for i in order],
                             [MIXED_PARAMS[i] for i in order], max_num_seqs=4)
    for pos, i in enumerate(order):
        assert reversed_batch[pos].token_ids == batch[i].token_ids, f"request {i} changed with the batch"
    for i, p in enumerate(MIXED_PARAMS):
        if not p.greedy:
            alone = run_llm(target, drafter, spec, budget or 64, [MIXED_PROMPTS[i]], [p], max_num_seqs=1)[0]
            assert alone.token_ids == batch[i].token_ids, f"seeded request {i} differs alone and in a batch"
    sampled = [batch[i].token_ids for i, p in enumerate(MIXED_PARAMS) if not p.greedy]
    assert len({tuple(t) for t in sampled}) == len(sampled)


SEEDED = [SamplingParams(temperature=1.0, max_tokens=24, seed=1, ignore_eos=True),
          SamplingParams(temperature=0.7, top_p=0.9, max_tokens=24, seed=2, ignore_eos=True),
          SamplingParams(temperature=1.3, top_k=12, min_p=0.02, max_tokens=24, seed=3, ignore_eos=True),
          SamplingParams(temperature=0.9, max_tokens=24, seed=4, ignore_eos=True)]


@pytest.mark.parametrize("spec,budget", [("ddtree", 16), ("dflash", 0)])
def test_seeded_sample_is_the_same_with_or_without_a_drafter(models, monkeypatch, spec, budget):
    """Uniforms are keyed by (seed, position), so speculation reproduces plain sampling token for token:
    a pathwise check of losslessness on top of the distributional one below."""
    target, drafter = models.target("qwen3-64"), models.drafter("qwen3-64", 8)
    prompts = PROMPTS[:len(SEEDED)]
    plain = [o.token_ids for o in run_llm(target, None, "none", 64, prompts, SEEDED)]
    assert [o.token_ids for o in run_llm(target, drafter, spec, budget or 64, prompts, SEEDED)] == plain
    # A drafter that proposes this very sample (behind decoys): deep acceptance, the same tokens.
    install_oracle(monkeypatch, {tuple(p): p + t for p, t in zip(prompts, plain)}, 64, decoy_rate=0.2)
    outs = run_llm(target, drafter, spec, budget or 64, prompts, SEEDED)
    assert [o.token_ids for o in outs] == plain
    assert mean_acceptance(outs) > 2.0


# ==================================================================================================
# Sampling losslessness: the joint law of the first three emitted tokens
# ==================================================================================================
V = 8  # small vocabulary: the joint of 3 tokens has 512 cells
CONTEXT, ROOT = [1, 2, 3, 4], 5  # the prompt, then the root (bonus) token every slot starts from
DEPTH = 3
SLOTS, CHUNK = 20000, 10000
BLOCK = 8
SAMPLING_TARGET = dict(arch="qwen3", vocab=V, hidden=32, layers=2, heads=2, kv_heads=1, intermediate=32,
                       init_std=0.5, seed=3)
PLAIN = dict(top_k=-1, top_p=1.0, min_p=0.0)
FILTERED = dict(top_k=6, top_p=0.9, min_p=0.05)


class SamplingSetup:
    def __init__(self, root: Path):
        self.path = path = make_target(root / "sampling-target", **SAMPLING_TARGET)
        self.hf = load_hf(path)
        self.target, _ = load_target(path, "cpu", torch.float32)
        torch.manual_seed(0)
        cfg = DrafterConfig.from_hf(drafter_hf_config(path, BLOCK))
        self.drafter = DFlashDrafter(cfg).float().eval()

    def conditionals(self, params: SamplingParams):
        """p(y1|ctx) [V], p(y2|ctx,y1) [V, V], p(y3|ctx,y1,y2) [V, V, V] from plain HF forwards."""
        pre = torch.tensor(CONTEXT + [ROOT])
        y12 = torch.cartesian_prod(torch.arange(V), torch.arange(V))
        with torch.no_grad():
            logits = self.hf(torch.cat([pre.expand(V * V, -1), y12], 1)).logits[:, -3:].float()
        st = SamplingTensors.build([params], [0], "cpu").rows(torch.zeros(V * V, 3, dtype=torch.long))
        p = processed_probs(logits, st).double()
        return p[0, 0], p[::V, 1], p[:, 2].view(V, V, V)

    def exact_joint(self, params):
        p1, p2, p3 = self.conditionals(params)
        return p1[:, None, None] * p2[:, :, None] * p3

    def draft_table(self, params) -> torch.Tensor:
        """An informative drafter: the exact first conditional, then the marginals; noise past depth 3."""
        joint = self.exact_joint(params)
        table = torch.stack([joint.sum((1, 2)), joint.sum((0, 2)), joint.sum((0, 1))]).add(1e-3).log().float()
        return torch.cat([table, torch.zeros(BLOCK - 1 - DEPTH, V)])

    def sample(self, spec: SpecConfig, params: SamplingParams, table: torch.Tensor | None,
               slots: int = SLOTS, chunk: int = CHUNK) -> tuple[torch.Tensor, float]:
        """Counts of (y1, y2, y3) [V**3] over `slots` seeds, and the mean acceptance length of rounds."""
        drafter = self.drafter if spec.method != "none" else None
        sp = Speculator(self.target, drafter, spec, slots=chunk, time_stages=False,
                        capacity=len(CONTEXT) + DEPTH * rows_per_round(spec, drafter) + 2)
        sp.prefill(0, CONTEXT)
        # Test-only broadcast: every slot holds the same committed context (rows < len(CONTEXT)).
        for cache in [sp.cache] + ([sp.draft_cache] if sp.draft_cache is not None else []):
            for t in cache.keys + cache.values:
                t[1:] = t[:1]
        if sp.history is not None:
            sp.history[1:] = sp.history[:1]
        if table is not None and drafter is not None:
            g = torch.Generator().manual_seed(1)
            per_slot = (table[None] + 0.7 * torch.randn(chunk, *table.shape, generator=g)).log_softmax(-1)
            sp.draft = lambda state, sampling, depths=None, layout=None: per_slot[:state.bonus.shape[0], :depths]
        s = sp.state
        counts = torch.zeros(V ** DEPTH, dtype=torch.long)
        means = []
        for start in range(0, slots, chunk):
            s.seq_lens.fill_(len(CONTEXT))
            s.active.fill_(True)
            s.bonus.fill_(ROOT)
            st = SamplingTensors.build([params] * chunk, list(range(start, start + chunk)), "cpu")
            got, chunk_means = first_emitted(lambda: sp.round(chunk, sampling=st).walk, chunk, DEPTH)
            means += chunk_means
            counts += torch.bincount((got[:, 0] * V + got[:, 1]) * V + got[:, 2], minlength=V ** DEPTH)
        return counts, sum(means) / len(means)

    def chi2(self, spec, params, table=True):
        counts, tau = self.sample(spec, params, self.draft_table(params) if table else None)
        stat, df, threshold = chi_square(counts, self.exact_joint(params))
        return stat, df, threshold, tau


@pytest.fixture(scope="module")
def sampling_setup(tmp_path_factory) -> SamplingSetup:
    return SamplingSetup(tmp_path_factory.mktemp("sampling"))


def test_sampling_target_is_peaky_and_path_dependent(sampling_setup):
    p1, p2, p3 = sampling_setup.conditionals(SamplingParams(temperature=1.0))
    tv = lambda a, b: 0.5 * (a - b).abs().sum(-1)  # noqa: E731
    assert p1.max() > 0.3 and p2.amax(-1).mean() > 0.35, "conditionals should be peaky"
    # y2's law depends on y1; y3's law depends on y1 even with y2 fixed (more than the last token matters).
    assert max(tv(p2[a], p2[b]).item() for a in range(V) for b in range(V)) > 0.5
    with_y2_fixed = torch.stack([tv(p3[a, c], p3[b, c]) for a in range(V) for b in range(V) for c in range(V)])
    assert with_y2_fixed.mean() > 0.1 and with_y2_fixed.max() > 0.5


# Two cases (one per method) stay in the quick subset; the rest of the grid is marked slow.
QUICK_SAMPLING_CASES = {("ddtree", 8, 1.0, "plain"), ("dflash", 0, 0.7, "filtered")}
SAMPLING_CASES = [pytest.param(*case, marks=() if case in QUICK_SAMPLING_CASES else pytest.mark.slow)
                  for case in ((spec, budget, temp, filt) for spec, budget in (("ddtree", 8), ("dflash", 0))
                               for temp in (0.7, 1.0) for filt in ("plain", "filtered"))]


@pytest.mark.parametrize("spec,budget,temperature,filters", SAMPLING_CASES)
def test_sampling_joint_is_exact(sampling_setup, spec, budget, temperature, filters):
    params = SamplingParams(temperature=temperature, **(FILTERED if filters == "filtered" else PLAIN))
    stat, df, threshold, tau = sampling_setup.chi2(SpecConfig(spec, budget or 64), params)
    print(f"{spec} T={temperature} {filters}: chi2 {stat:.1f} df {df} threshold {threshold:.1f} tau {tau:.2f}")
    assert tau > 1.5, "the draft table should make rounds accept several tokens"
    assert stat < threshold


@pytest.mark.parametrize("filters", ["plain", "filtered"])
def test_sampling_joint_autoregressive(sampling_setup, filters):
    """spec="none" is the same round over a root-only tree."""
    params = SamplingParams(temperature=1.0, **(FILTERED if filters == "filtered" else PLAIN))
    stat, df, threshold, tau = sampling_setup.chi2(SpecConfig("none"), params)
    print(f"none {filters}: chi2 {stat:.1f} df {df} threshold {threshold:.1f}")
    assert tau == 1.0 and stat < threshold


@pytest.mark.parametrize("spec,budget", [("none", 0), ("ddtree", 8)])
def test_sampling_joint_is_exact_with_prompt_lookup(sampling_setup, spec, budget):
    # Copied continuations depend on the tokens sampled so far (the context holds none of the root's):
    # drafts that adapt to the sample must not bend its law either. (ngram_sampled: CPU rounds verify lookup's
    # rows for sampled requests too, as CUDA rounds do by default.)
    params = SamplingParams(temperature=1.0)
    stat, df, threshold, tau = sampling_setup.chi2(SpecConfig(spec, budget or 64, ngram_tokens=4, ngram_sampled=True),
                                                   params)
    print(f"{spec} + lookup: chi2 {stat:.1f} df {df} threshold {threshold:.1f} tau {tau:.2f}")
    assert tau > (1.05 if spec == "none" else 1.5), "copied tokens should be accepted in some rounds"
    assert stat < threshold


def test_sampling_joint_with_the_real_drafter(sampling_setup):
    params = SamplingParams(temperature=1.0)
    stat, df, threshold, tau = sampling_setup.chi2(SpecConfig("ddtree", 8), params, table=False)
    print(f"ddtree real drafter: chi2 {stat:.1f} df {df} threshold {threshold:.1f} tau {tau:.2f}")
    assert stat < threshold


# --- teeth: deliberately broken verifiers must fail the same test --------------------------------------
def reused_coin(monkeypatch):
    """Every node of a slot draws with the same uniform, whatever position it draws."""
    original = sampling_module.draw_uniforms
    monkeypatch.setattr(sampling_module, "draw_uniforms",
                        lambda seed, positions: original(seed, positions[:, :1]).expand_as(positions))


def relaxed_acceptance(monkeypatch):
    """When no child matches the derived token, also accept a child in the target's top-2 at the parent."""
    stash = {}
    original_derive = round_module.derive

    def derive(logits, st, positions):
        stash["top2"] = logits.topk(2, dim=-1).indices
        return original_derive(logits, st, positions)

    def walk(tree, derived):
        slots, n = tree.tokens.shape
        idx = torch.arange(n)
        parent_top2 = stash["top2"].gather(1, tree.parents[:, :, None].expand(-1, -1, 2))
        exact = tree.valid & (tree.tokens == derived.gather(1, tree.parents)) & (idx > 0)
        loose = tree.valid & (parent_top2 == tree.tokens[:, :, None]).any(-1) & (idx > 0)
        # The child each node moves to: an exact match first, else the first loose one.
        score = torch.where(exact, 2 * n - idx, torch.where(loose, n - idx, 0))
        best = torch.zeros(slots, n, dtype=torch.long).scatter_reduce(1, tree.parents, score, "amax")
        child = torch.where(best > n, 2 * n - best, torch.where(best > 0, n - best, 0))
        path = torch.zeros(slots, tree.max_depth + 1, dtype=torch.long)
        emitted = torch.zeros_like(path)
        accepted = torch.ones(slots, dtype=torch.long)
        current, alive = torch.zeros(slots, dtype=torch.long), torch.ones(slots, dtype=torch.bool)
        for d in range(tree.max_depth):
            nxt = child.gather(1, current[:, None])[:, 0]
            alive = alive & (nxt > 0)
            emitted[:, d] = torch.where(alive, tree.tokens.gather(1, nxt[:, None])[:, 0], emitted[:, d])
            current = torch.where(alive, nxt, current)
            path[:, d + 1] = torch.where(alive, nxt, 0)
            accepted += alive.long()
        emitted.scatter_(1, (accepted - 1)[:, None], derived.gather(1, current[:, None]))
        return Walk(path=path, accepted=accepted, emitted=emitted)

    monkeypatch.setattr(round_module, "derive", derive)
    monkeypatch.setattr(round_module, "walk", walk)


def duplicate_sibling(monkeypatch):
    """The root's second child carries the same token as its first child."""
    original = Speculator.build

    def build(self, bonus, logprobs, budget=None):
        tree = original(self, bonus, logprobs, budget)
        both = (tree.depths[:, 1] == 1) & (tree.depths[:, 2] == 1) & tree.valid[:, 2]
        tokens = tree.tokens.clone()
        tokens[:, 2] = torch.where(both, tokens[:, 1], tokens[:, 2])
        return replace(tree, tokens=tokens)

    monkeypatch.setattr(Speculator, "build", build)


BROKEN = {"reused_coin": reused_coin, "relaxed_acceptance": relaxed_acceptance,
          "duplicate_sibling": duplicate_sibling}


@pytest.mark.slow  # they test the test (its teeth), not treeflash
@pytest.mark.parametrize("bug,spec,budget", [("reused_coin", "ddtree", 8), ("reused_coin", "dflash", 0),
                                             ("relaxed_acceptance", "ddtree", 8),
                                             ("relaxed_acceptance", "dflash", 0),
                                             ("duplicate_sibling", "ddtree", 8)])
def test_broken_verifiers_fail(sampling_setup, monkeypatch, bug, spec, budget):
    BROKEN[bug](monkeypatch)
    params = SamplingParams(temperature=1.0)
    try:
        stat, df, threshold, tau = sampling_setup.chi2(SpecConfig(spec, budget or 64), params)
    except RuntimeError as e:
        # Duplicate siblings can put two accepted paths in one tree: where they hold more nodes than a path
        # has depths, the walk's count runs past the emitted tokens and the round fails. Caught either way.
        assert bug == "duplicate_sibling" and "out of bounds" in str(e), e
        return
    print(f"{bug} {spec}: chi2 {stat:.1f} df {df} threshold {threshold:.1f} tau {tau:.2f}")
    assert stat > threshold


# --- the engine's first token and its first round -------------------------------------------------------
@pytest.mark.parametrize("spec", ["none", "ddtree"])
def test_engine_joint_of_first_two_tokens(sampling_setup, tmp_path, spec):
    """Through LLM.generate: the token drawn after prefill and the first round's token are independent
    draws (a round reusing the prefill draw's uniform makes them comonotone)."""
    path = sampling_setup.path
    drafter = make_drafter(tmp_path / "drafter", path, BLOCK) if spec != "none" else None
    n = 1000
    params = [SamplingParams(temperature=1.0, max_tokens=2, seed=i, ignore_eos=True) for i in range(n)]
    outs = run_llm(path, drafter, spec, 8, [CONTEXT] * n, params, max_num_seqs=n)
    y = torch.tensor([o.token_ids for o in outs])
    counts = torch.bincount(y[:, 0] * V + y[:, 1], minlength=V * V)
    pre = torch.tensor(CONTEXT)
    with torch.no_grad():
        logits = sampling_setup.hf(torch.cat([pre.expand(V, -1), torch.arange(V)[:, None]], 1)).logits[:, -2:]
    p = torch.softmax(logits.double(), -1)
    stat, df, threshold = chi_square(counts, p[0, 0][:, None] * p[:, 1])
    print(f"engine first two tokens ({spec}): chi2 {stat:.1f} df {df} threshold {threshold:.1f}")
    assert stat < threshold

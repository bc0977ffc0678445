"""The z-lab DFlash checkpoint format, both ways, against the reference `dflash` package; and the
refusal of drafter/target pairs that cannot work, before anything is generated."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from treeflash.checkpoint import load_drafter, load_target
from treeflash.config import ConfigError, UnsupportedModelError
from treeflash.llm import LLM
from treeflash.models.dflash import DFlashDrafter, DrafterConfig, DrafterMismatchError, save_drafter
from treeflash.round import SpecConfig, Speculator
from treeflash.sampling import SamplingParams, SamplingTensors

from spec_helpers import drafter_hf_config, hf_greedy, load_hf, make_drafter, make_target

VOCAB, TARGET_LAYERS = 64, 5
CONTEXT = [3, 17, 42, 5, 9, 30, 11, 2, 60, 7]
BONUS = 21
SCALED = dict(input_embedding_scale=1.7, output_multiplier=0.6, final_logit_softcapping=4.0)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return make_target(tmp_path_factory.mktemp("fmt") / "target", arch="qwen3", vocab=VOCAB, hidden=32,
                       layers=TARGET_LAYERS, heads=4, kv_heads=2, init_std=0.15, seed=5)


def randomize_norms(module: torch.nn.Module, seed: int) -> None:
    """RMSNorm weights start at 1; perturb them so a norm applied in the wrong place shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))


# --- logits on both sides ------------------------------------------------------------------------------
def reference_logits(ref_model, hf_target, context: list[int], bonus: int) -> torch.Tensor:
    """The reference package's draft logits [block_size - 1, V] for `context`, block [bonus, MASK...]."""
    from dflash.model import extract_context_feature

    block_size, mask = ref_model.block_size, ref_model.mask_token_id
    scale = float(ref_model.config.dflash_config.get("input_embedding_scale", 1.0))
    with torch.no_grad():
        out = hf_target(torch.tensor([context]), output_hidden_states=True)
        target_hidden = extract_context_feature(out.hidden_states, ref_model.target_layer_ids)
        block = torch.tensor([[bonus] + [mask] * (block_size - 1)])
        noise = hf_target.get_input_embeddings()(block) * scale
        positions = torch.arange(len(context) + block_size)[None]
        hidden = ref_model(target_hidden=target_hidden, noise_embedding=noise, position_ids=positions)
        return ref_model.compute_logits(hidden[:, 1:], hf_target.lm_head)[0].float()


class Ours:
    """treeflash's target + drafter, driven through the Speculator; captures the raw draft logits."""

    def __init__(self, target_dir: Path, drafter_dir: Path, spec: SpecConfig = SpecConfig("dflash")):
        self.target, cfg = load_target(target_dir, "cpu", torch.float32)
        self.drafter = load_drafter(drafter_dir, "cpu", torch.float32)
        self.drafter.config.check_target(cfg)
        self.speculator = Speculator(self.target, self.drafter, spec, slots=1, capacity=64, time_stages=False)
        self.raw = {}
        original = self.drafter.logits

        def capture(hidden, weight):
            self.raw["logits"] = original(hidden, weight)
            return self.raw["logits"]

        self.drafter.logits = capture

    def draft(self, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(raw logits, log-probs) [block_size - 1, V] of the draft for the slot's current state."""
        st = SamplingTensors.build([SamplingParams(temperature=temperature)], [0], "cpu")
        logprobs = self.speculator.draft(self.speculator.state, st)
        return self.raw["logits"][0], logprobs[0]


def assert_same_drafts(ours: Ours, ref_model, hf_target, context, bonus):
    ours.speculator.prefill(0, context)
    ours.speculator.set_bonus(0, bonus)
    expected = reference_logits(ref_model, hf_target, context, bonus)
    for temperature in (1.0, 0.6):
        logits, logprobs = ours.draft(temperature)
        assert logits.shape == expected.shape == (ours.drafter.config.depth, VOCAB)
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logprobs, torch.log_softmax(expected / temperature, -1), atol=1e-4, rtol=1e-4)
    return expected


def load_reference(path: Path):
    from dflash.model import DFlashDraftModel

    return DFlashDraftModel.from_pretrained(str(path), dtype=torch.float32).eval()


@pytest.mark.reference
@pytest.mark.parametrize("variant", ["plain", "scaled", "two_layers"])
def test_treeflash_drafter_loads_in_reference(target_dir, tmp_path, variant):
    extra = SCALED if variant == "scaled" else {}
    layers, ids = (2, [0, 3]) if variant == "two_layers" else (1, [2])
    torch.manual_seed(11)
    cfg = DrafterConfig.from_hf(drafter_hf_config(target_dir, block_size=6, layers=layers, mask_token_id=VOCAB - 2,
                                                  target_layer_ids=ids, **extra))
    drafter = DFlashDrafter(cfg).float()
    randomize_norms(drafter, seed=1)
    save_drafter(drafter, tmp_path / "drafter")

    ref = load_reference(tmp_path / "drafter")
    assert ref.block_size == 6 and ref.mask_token_id == VOCAB - 2 and list(ref.target_layer_ids) == ids
    hf = load_hf(target_dir)
    expected = assert_same_drafts(Ours(target_dir, tmp_path / "drafter"), ref, hf, CONTEXT, BONUS)
    if variant == "scaled":
        # The scales matter: the same weights without them give clearly different logits.
        ref.config.dflash_config = {k: v for k, v in ref.config.dflash_config.items() if k not in SCALED}
        assert (reference_logits(ref, hf, CONTEXT, BONUS) - expected).abs().max() > 1e-2


@pytest.mark.reference
@pytest.mark.parametrize("variant", ["explicit_ids", "default_ids", "scaled"])
def test_reference_drafter_loads_here(target_dir, tmp_path, variant):
    from transformers import Qwen3Config
    from dflash.model import DFlashDraftModel

    dflash_config = {"mask_token_id": VOCAB - 1}
    if variant != "default_ids":
        # Unsorted, and including the last target layer, whose HF hidden state is after the final norm.
        dflash_config["target_layer_ids"] = [4, 1]
    if variant == "scaled":
        dflash_config.update(SCALED)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.2,
                      tie_word_embeddings=False, block_size=5, num_target_layers=TARGET_LAYERS,
                      dflash_config=dflash_config)
    torch.manual_seed(12)
    ref = DFlashDraftModel(cfg).float().eval()
    randomize_norms(ref, seed=2)
    ref.save_pretrained(str(tmp_path / "drafter"))

    ours = Ours(target_dir, tmp_path / "drafter")
    c = ours.drafter.config
    assert c.block_size == 5 and c.mask_token_id == VOCAB - 1
    assert list(c.target_layer_ids) == list(ref.target_layer_ids)
    if variant == "default_ids":
        assert list(c.target_layer_ids) == [1, 2]  # K=2 ids spread over [1, N-3] of N=5 target layers
    assert_same_drafts(ours, ref, load_hf(target_dir), CONTEXT, BONUS)


@pytest.mark.reference
def test_draft_after_a_round_matches_reference_from_scratch(target_dir, tmp_path):
    """After verify rounds the drafter's cached context (prompt + accepted tree nodes, features taken
    from the tree forward, KV compacted) must equal the reference's context computed from scratch.

    The trees are built from oracle log-probs (the target's greedy continuation, with a decoy ranked
    above the truth at depth 1), so accepted paths are deep and leave the first child."""
    make_drafter(tmp_path / "drafter", target_dir, block_size=8, layers=2, target_layer_ids=[1, 4], seed=4)
    ref = load_reference(tmp_path / "drafter")
    hf = load_hf(target_dir)
    ours = Ours(target_dir, tmp_path / "drafter", SpecConfig("ddtree", 12))
    sp = ours.speculator
    sp.prefill(0, CONTEXT)
    sp.set_bonus(0, BONUS)
    committed, depth = list(CONTEXT), ours.drafter.config.depth
    greedy = SamplingTensors.build([SamplingParams(temperature=0.0)], [0], "cpu")
    g = torch.Generator().manual_seed(0)
    accepted_lengths = []
    for _ in range(3):
        root = int(sp.state.bonus[0])
        truth = hf_greedy(hf, committed + [root], depth)
        oracle = 0.5 * torch.randn(depth, VOCAB, generator=g)
        oracle[torch.arange(depth), truth] += 8.0
        oracle[0, (truth[0] + 1) % VOCAB] += 9.0
        sp.build = lambda bonus, logprobs, budget=None: Speculator.build(sp, bonus, oracle.log_softmax(-1)[None], budget)
        w = sp.round(1, sampling=greedy).walk
        del sp.build
        accepted = int(w.accepted[0])
        accepted_lengths.append(accepted)
        assert w.emitted[0, :accepted].tolist() == truth[:accepted]
        committed += [root] + w.emitted[0, :accepted - 1].tolist()
        assert int(sp.state.seq_lens[0]) == len(committed)
        expected = reference_logits(ref, hf, committed, int(sp.state.bonus[0]))
        logits, _ = ours.draft(1.0)
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    assert min(accepted_lengths) >= 4


@pytest.mark.parametrize("rope", [None, {"rope_type": "linear", "factor": 2.0},
                                  {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64},
                                  {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                   "beta_fast": 16.0, "truncate": False}])
def test_config_round_trip(target_dir, rope):
    """Every field, the RoPE's scaling too (config.json used to say "default" whatever the drafter ran)."""
    hf = drafter_hf_config(target_dir, block_size=7, layers=2, target_layer_ids=[0, 4], **SCALED)
    if rope is not None:
        hf["rope_parameters"] = {"rope_theta": 10000.0, **rope}
    cfg = DrafterConfig.from_hf(hf)
    assert cfg.layers.rope.kind == (rope or {"rope_type": "default"})["rope_type"]
    assert DrafterConfig.from_hf(cfg.to_hf()) == cfg
    assert (cfg.block_size, cfg.depth, cfg.target_layer_ids) == (7, 6, (0, 4))
    assert (cfg.input_embedding_scale, cfg.output_multiplier, cfg.final_logit_softcapping) == (1.7, 0.6, 4.0)


# --- refusals ------------------------------------------------------------------------------------------
def edit_config(path: Path, edit) -> Path:
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


MISMATCHES = {  # name -> (config edit, drafter builder kwargs, message fragment)
    "hidden_size": (None, dict(hidden=48), "hidden size 48"),
    "num_target_layers": (lambda c: c.update(num_target_layers=TARGET_LAYERS + 2), {}, "7-layer target"),
    "layer_id_out_of_range": (lambda c: c["dflash_config"].update(target_layer_ids=[TARGET_LAYERS]), {},
                              "outside the target's 5 layers"),
    "negative_layer_id": (lambda c: c["dflash_config"].update(target_layer_ids=[-1]), {}, "target_layer_ids [-1]"),
    "vocabulary": (lambda c: c.update(vocab_size=VOCAB + 1), {}, "vocabulary 65"),
    "mask_outside_table": (lambda c: c["dflash_config"].update(mask_token_id=VOCAB), {}, "mask_token_id 64"),
    "not_dflash": (lambda c: c.update(architectures=["Qwen3ForCausalLM"]), {}, "not a DFlash drafter"),
    "missing_mask": (lambda c: c["dflash_config"].pop("mask_token_id"), {}, "mask_token_id"),
    "block_size_1": (lambda c: c.update(block_size=1), {}, "block_size"),
}


@pytest.mark.parametrize("name", list(MISMATCHES))
def test_mismatched_drafter_is_refused(target_dir, tmp_path, name):
    edit, kwargs, fragment = MISMATCHES[name]
    path = make_drafter(tmp_path / "drafter", target_dir, block_size=4, target_layer_ids=[2], **kwargs)
    if edit is not None:
        edit_config(path, edit)
    with pytest.raises(DrafterMismatchError, match=re.escape(fragment)):
        LLM(str(target_dir), device="cpu", dtype="float32", draft_model=str(path), spec="ddtree")


def test_matching_drafter_is_accepted(target_dir, tmp_path):
    """Accepted means loaded and drafting: every token after the first comes from a drafted round, and
    the output is still the target's greedy continuation."""
    path = make_drafter(tmp_path / "drafter", target_dir, block_size=4, target_layer_ids=[2])
    llm = LLM(str(target_dir), device="cpu", dtype="float32", draft_model=str(path), spec="dflash",
              record_trees=True, ngram_tokens=0)
    assert llm.drafter is not None and llm.drafter.config.target_layer_ids == (2,)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out = llm.generate(prompt_token_ids=[CONTEXT], sampling_params=params, use_tqdm=False)[0]
    assert out.token_ids == hf_greedy(load_hf(target_dir), CONTEXT, 6)
    assert out.metrics.rounds >= 1 and sum(out.metrics.acceptance_lengths) >= 5
    assert "(3 draft nodes," in out.last_tree  # the drafter's chain: block_size - 1 nodes per round


@pytest.mark.parametrize("edit, message", [
    # the reference's newer drafters (z-lab/dflash: Qwen3DFlashAttention) ...
    (dict(layer_types=["sliding_attention"], sliding_window=2048, use_sliding_window=True),
     "drafter layers of types ['sliding_attention'] (sliding_window 2048)"),
    (dict(layer_types=["sliding_attention"], sliding_window=2048), "only full attention"),  # (the flag unset)
    (dict(use_sliding_window=True, sliding_window=512), "sliding_window 512"),
    (dict(is_causal=True), "causal inside its block"),
])
def test_drafters_that_attend_otherwise_are_refused(target_dir, tmp_path, edit, message):
    """Drafted as the whole-block, whole-context attention this engine runs, their output would stay exact but
    the drafts would not be the drafter's: refused by name instead."""
    path = make_drafter(tmp_path / "drafter", target_dir, block_size=4, target_layer_ids=[2])
    edit_config(path, lambda c: c.update(edit))
    with pytest.raises(UnsupportedModelError, match=re.escape(message)):
        LLM(str(target_dir), device="cpu", dtype="float32", draft_model=str(path), spec="ddtree")
    full = make_drafter(tmp_path / "full", target_dir, block_size=4, target_layer_ids=[2])
    edit_config(full, lambda c: c.update(layer_types=["full_attention"], is_causal=False))
    LLM(str(target_dir), device="cpu", dtype="float32", draft_model=str(full), spec="ddtree")


@pytest.mark.parametrize("key,value,message", [
    ("block_size", "8", "'block_size' must be an integer"),
    ("num_target_layers", 5.5, "'num_target_layers' must be an integer"),
    ("dflash_config", [], "'dflash_config' must be an object"),
    ("target_layer_ids", [1, "2"], "'target_layer_ids' must be a list of integers"),
])
def test_mistyped_drafter_config_key_is_named(target_dir, tmp_path, key, value, message):
    path = make_drafter(tmp_path / "drafter", target_dir, block_size=4, target_layer_ids=[2])
    edit_config(path, lambda c: (c["dflash_config"] if key == "target_layer_ids" else c).update({key: value}))
    with pytest.raises(ConfigError, match=re.escape(f"{path / 'config.json'}: {message}")):
        LLM(str(target_dir), device="cpu", dtype="float32", draft_model=str(path), spec="ddtree")


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(spec="ddtree"), "needs draft_model"),
    (dict(spec="dflash"), "needs draft_model"),
    (dict(spec="medusa", draft_model="DRAFTER"), "spec must be one of"),
    (dict(spec="ddtree", draft_model="DRAFTER", tree_budget=0), "tree_budget"),
    (dict(spec="ddtree", draft_model="DRAFTER", tree_budget=-3), "tree_budget"),
    (dict(spec="ddtree", draft_model="DRAFTER", tree_budget=2.5), "tree_budget"),
])
def test_bad_spec_arguments_are_refused(target_dir, tmp_path, kwargs, fragment):
    path = make_drafter(tmp_path / "drafter", target_dir, block_size=4, target_layer_ids=[2])
    kwargs = {k: (str(path) if v == "DRAFTER" else v) for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=fragment):
        LLM(str(target_dir), device="cpu", dtype="float32", **kwargs)


def test_speculator_refuses_spec_without_drafter(target_dir):
    target, _ = load_target(target_dir, "cpu", torch.float32)
    with pytest.raises(ValueError, match="needs a draft model"):
        Speculator(target, None, SpecConfig("ddtree", 4), slots=1, capacity=16)
    with pytest.raises(ValueError):
        SpecConfig("ddtree", 0)

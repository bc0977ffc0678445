"""Shared builders for the speculative-decoding tests: tiny random targets and DFlash drafters on disk,
plain autoregressive references, an oracle drafter, and a chi-square test with merged bins."""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import torch

from treeflash.models.dflash import DFlashDrafter, DrafterConfig, save_drafter
from treeflash.round import Speculator


# --- tiny targets ---------------------------------------------------------------------------------
def make_target(path: Path, arch: str = "qwen3", vocab: int = 64, hidden: int = 32, layers: int = 2,
                heads: int = 4, kv_heads: int = 2, intermediate: int = 64, seed: int = 0,
                init_std: float = 0.02, head_scale: float = 1.0, tie: bool = False, experts: int = 8,
                window: int | None = None) -> Path:
    """A random float32 HF checkpoint (Qwen3ForCausalLM, LlamaForCausalLM, MistralForCausalLM, the mixtures
    Qwen3MoeForCausalLM, MixtralForCausalLM and GptOssForCausalLM with `experts` experts of width intermediate / 2,
    two per token, SmolLM3ForCausalLM with its first layer NoPE, Phi3ForCausalLM with half of each head rotated and
    LongRoPE, or Gemma3ForCausalLM) saved at `path`. window: Mistral's, Phi-3's and GPT-OSS's sliding window
    (GPT-OSS's on every other layer, with its attention sinks; SmolLM3's on its NoPE layer; Gemma 3's on its first
    layer, with its local RoPE).

    init_std: the normal init of every linear and embedding weight; head_scale multiplies the output
    head (peakier next-token distributions). No eos/bos, so generation never stops early.
    """
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GptOssConfig, GptOssForCausalLM, LlamaConfig,
                              LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                              Phi3Config, Phi3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM, SmolLM3Config,
                              SmolLM3ForCausalLM)

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                  max_position_embeddings=512, tie_word_embeddings=tie, initializer_range=init_std,
                  eos_token_id=None, bos_token_id=None, pad_token_id=None, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen3_moe":
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, num_experts=experts, num_experts_per_tok=2,
                                                   moe_intermediate_size=intermediate // 2, norm_topk_prob=True))
    elif arch == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(**common | dict(intermediate_size=intermediate // 2),
                                                 num_local_experts=experts, num_experts_per_tok=2))
    elif arch == "mistral":
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=window))
    elif arch == "gpt_oss":
        model = GptOssForCausalLM(GptOssConfig(**common | dict(intermediate_size=intermediate // 2),
                                               num_local_experts=experts, num_experts_per_tok=2, sliding_window=window))
        with torch.no_grad():  # (transformers starts biases and sinks at zero: a model that ignored them would pass)
            for name, p in model.named_parameters():
                if name.endswith(("bias", "sinks")):
                    p.normal_(0, 0.5)
    elif arch == "smollm3":
        model = SmolLM3ForCausalLM(SmolLM3Config(**common, no_rope_layers=[0] + [1] * (layers - 1),
                                                 use_sliding_window=window is not None, sliding_window=window,
                                                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    elif arch == "phi3":
        half = hidden // heads // 4  # the rotated frequencies of half a head
        model = Phi3ForCausalLM(Phi3Config(**common, sliding_window=window, partial_rotary_factor=0.5,
                                           original_max_position_embeddings=512, rope_parameters={
                                               "rope_type": "longrope", "rope_theta": 10000.0, "factor": 8.0,
                                               "short_factor": [1.0 + i for i in range(half)],
                                               "long_factor": [2.0 + i for i in range(half)]}))
    elif arch == "gemma3":
        types = ["sliding_attention"] + ["full_attention"] * (layers - 1)
        model = Gemma3ForCausalLM(Gemma3TextConfig(**common, sliding_window=window or 4096,
                                                   query_pre_attn_scalar=hidden // heads, layer_types=types))
        with torch.no_grad():  # (transformers starts Gemma's norm weights at zero: 1 + w is then 1 everywhere)
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0, 0.3)
    else:
        raise ValueError(arch)
    model = model.float().eval()
    if head_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(head_scale)
    model.save_pretrained(str(path))
    return Path(path)


def load_hf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """transformers `generate(do_sample=False)`: the first n new tokens."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


# --- tiny drafters --------------------------------------------------------------------------------
def drafter_hf_config(target_dir: Path, block_size: int, layers: int = 1, mask_token_id: int | None = None,
                      target_layer_ids: list[int] | None = None, hidden: int | None = None,
                      **dflash_extra) -> dict:
    """A z-lab style drafter config.json dict for the target saved at `target_dir`."""
    import json

    t = json.loads((Path(target_dir) / "config.json").read_text())
    hidden = hidden or t["hidden_size"]
    heads = t["num_attention_heads"]
    dflash = {"mask_token_id": t["vocab_size"] - 1 if mask_token_id is None else mask_token_id}
    if target_layer_ids is not None:
        dflash["target_layer_ids"] = list(target_layer_ids)
    dflash.update(dflash_extra)
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block_size,
        "dflash_config": dflash, "num_target_layers": t["num_hidden_layers"], "vocab_size": t["vocab_size"],
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": t["num_key_value_heads"], "head_dim": hidden // heads,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
    }


def make_drafter(path: Path, target_dir: Path, block_size: int, seed: int = 0, **kwargs) -> Path:
    """A random treeflash DFlash drafter for the target at `target_dir`, saved with `save_drafter`."""
    torch.manual_seed(seed)
    drafter = DFlashDrafter(DrafterConfig.from_hf(drafter_hf_config(target_dir, block_size, **kwargs)))
    save_drafter(drafter.float(), path)
    return Path(path)


# --- the oracle drafter -------------------------------------------------------------------------
def install_oracle(monkeypatch, known: dict[tuple[int, ...], list[int]], vocab: int, decoy_rate: float = 0.3,
                   seed: int = 0) -> None:
    """Replace the drafter's output by log-probs that mostly put the true greedy continuation first.

    known: prompt -> prompt + its greedy continuation. At depth d a slot whose committed length is n
    drafts for sequence position n + d: the true token gets a high logit; with probability
    `decoy_rate` another token gets a higher one, so the truth is second (a side branch of a DDTree,
    a rejection for the chain). Unknown positions and unknown requests get noise that depends only on
    the slot's own state (committed length, bonus), so a request's drafts do not depend on its batch.
    """
    sequences: dict[tuple[int, int], list[int]] = {}
    original_batch = Speculator.prefill_batch

    def prefill_batch(self, pieces, *args, **kwargs):  # (every prefill, eager or a graph's, builds one)
        for piece in pieces:
            sequences[(id(self), piece.slot)] = known.get(tuple(piece.prompt))
        return original_batch(self, pieces, *args, **kwargs)

    def draft(self, state, sampling, depths=None, layout=None):
        depth = self.drafter.config.depth
        seq_lens, bonus = state.seq_lens.tolist(), state.bonus.tolist()
        out = torch.empty(len(seq_lens), depth, vocab)
        for s, (n, b) in enumerate(zip(seq_lens, bonus)):
            g = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{n}/{b}".encode()))
            logits = 0.5 * torch.randn(depth, vocab, generator=g)
            decoys = torch.randint(0, vocab, (depth,), generator=g)
            use_decoy = torch.rand(depth, generator=g) < decoy_rate
            full = sequences.get((id(self), s))
            if full is not None and n < len(full) and full[n] == b:
                for d in range(depth):
                    if n + 1 + d < len(full):
                        logits[d, full[n + 1 + d]] += 8.0
                        if use_decoy[d] and decoys[d] != full[n + 1 + d]:
                            logits[d, decoys[d]] += 9.0
            out[s] = logits
        return torch.log_softmax(out[:, :depths] / sampling.temperature[:, None, None], dim=-1)

    monkeypatch.setattr(Speculator, "prefill_batch", prefill_batch)
    monkeypatch.setattr(Speculator, "draft", draft)


# --- sampled rounds -------------------------------------------------------------------------------
def first_emitted(next_walk, slots: int, depth: int) -> tuple[torch.Tensor, list[float]]:
    """The first `depth` tokens each of `slots` slots emits over rounds (`next_walk()` runs one and returns
    its Walk) [slots, depth], and each round's mean accepted count."""
    got = torch.zeros(slots, depth, dtype=torch.long)
    have = torch.zeros(slots, dtype=torch.long)
    means = []
    while have.min() < depth:
        w = next_walk()
        j = torch.arange(w.emitted.shape[1])[None]
        pos = have[:, None] + j
        take = (j < w.accepted[:, None]) & (pos < depth)
        rows = torch.arange(slots)[:, None].expand_as(pos)
        got[rows[take], pos[take]] = w.emitted[take]
        have += w.accepted
        means.append(w.accepted.float().mean().item())
    return got, means


# --- statistics -----------------------------------------------------------------------------------
def chi_square(observed: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 10.0):
    """Pearson's chi-square of counts against exact cell probabilities, small cells merged.

    Cells are sorted by expected count and merged greedily until each bin expects >= min_expected.
    Returns (statistic, degrees of freedom, threshold df + 10 sqrt(2 df)). A count in a cell of
    probability zero makes the statistic infinite.
    """
    observed = observed.flatten().double()
    probs = expected_probs.flatten().double()
    total = observed.sum().item()
    if (observed[probs <= 0] > 0).any():
        return math.inf, 1, 1 + 10 * math.sqrt(2)
    keep = probs > 0
    observed, expected = observed[keep], probs[keep] / probs[keep].sum() * total
    order = expected.argsort()
    bins_o, bins_e, acc_o, acc_e = [], [], 0.0, 0.0
    for i in order.tolist():
        acc_o += observed[i].item()
        acc_e += expected[i].item()
        if acc_e >= min_expected:
            bins_o.append(acc_o)
            bins_e.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:  # leftovers join the last full bin
        if bins_e:
            bins_o[-1] += acc_o
            bins_e[-1] += acc_e
        else:
            bins_o.append(acc_o)
            bins_e.append(acc_e)
    o, e = torch.tensor(bins_o), torch.tensor(bins_e)
    stat = (((o - e) ** 2) / e).sum().item()
    df = max(len(bins_o) - 1, 1)
    return stat, df, df + 10 * math.sqrt(2 * df)


def random_tree_shape(rng, slots: int, n: int, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random parents and depths [slots, n] of trees no deeper than `depth` (parents precede children; node 0
    the root), for kernels that follow paths."""
    parents = torch.zeros(slots, n, dtype=torch.long)
    depths = torch.zeros(slots, n, dtype=torch.long)
    for s in range(slots):
        for i in range(1, n):
            p = rng.randrange(i)
            while depths[s, p] == depth:
                p = rng.randrange(i)
            parents[s, i], depths[s, i] = p, depths[s, p] + 1
    return parents, depths

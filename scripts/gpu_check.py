"""Behaviour checks and round timings on a CUDA device (run on the lent H200 through the device tool).

Checks that the CUDA path (CUDA graphs on, the default) is the same engine as the CPU path, and times
the round eagerly and graphed. Prints the results and writes a JSON file (updated after each section).

  python scripts/gpu_check.py --out results/gpu_check.json [--smollm2 /path/SmolLM2-135M-Instruct.Q4_1.gguf]
                              [--sections TEFLABCR] [--timings qwen3-8b,smollm2-135m] [--budget-s SECONDS]

A. tiny random Llama / Qwen2 / Qwen3 / Mistral with an 8-token window / GPT-OSS (windows, sinks, biased experts)
   / SmolLM3 (a NoPE layer with a window) / Phi-3 (fused projections, half of each head rotated, LongRoPE)
   / Gemma 3 (windows with their own RoPE, (1 + w) norms around attention and MLP, a scaled embedding, GELU)
   (float32): greedy tokens identical to transformers on the GPU.
B. tiny random DFlash drafter: dflash and ddtree greedy identical to plain decoding; seeded sampling
   reproducible alone and inside a mixed batch, and identical to plain sampling with the same seed.
C. no host synchronisation inside an eager round: every round runs under
   torch.cuda.set_sync_debug_mode("error") (greedy + sampled rows, top-k/top-p/min-p on; none / dflash /
   ddtree, and none and ddtree with prompt lookup).
D. with --smollm2: the real model, greedy float32 identical to transformers on the GPU, and bf16 runs.
E. graphed == eager (float32): the same requests (greedy and seeded sampling, mixed in one batch) give
   identical tokens with CUDA graphs on and off (rounds and prefill), for none / dflash / ddtree (and
   ddtree with the Triton tree builder; none and ddtree with prompt lookup), with every attention backend; tree_budget="auto" greedy equals plain decoding.
   Graphed runs overlap their rounds (the engine's default there); one more run puts the four requests
   through two slots, so requests end and slots are reused while a round for them is in flight.
F. no host synchronisation inside a replayed round (set_sync_debug_mode("error") around replays; the methods of C).
L. log-probs, penalties, logit_bias and min_tokens (float32, none / dflash / ddtree / ddtree + lookup, mixed
   batches): asking for log-probs changes no token, graphed == eager, graphed log-probs equal eager ones and
   match transformers' log_softmax over prompt + output; with penalties, a logit_bias and min_tokens graphed ==
   eager, requests without them keep their tokens, penalised greedy equals plain decoding's (and transformers'
   repetition penalty); with allowed_token_ids and a request asking for prompt log-probs graphed == eager,
   only allowed tokens, masked greedy equals plain decoding's, prompt log-probs match transformers'; with
   bad words graphed == eager, none in the output, the same sample as plain decoding's (drafts adjusted to
   the requests' bias, penalties and min_tokens, the engine's default); the drafts' log-softmax kernel over
   rows masked in whole pieces; the penalty kernel equal to the torch ops bit for bit; replayed
   rounds with log-probs or penalties run without host sync; with --logprobs-timings SHAPES,
   graphed rounds without / with log-probs / with penalties and the rest / allowed tokens / bad words, the
   second and third with drafts adjusted to them and blind (batch 1 and 8, AR step and DDTree-64, context 1024).
S. structured outputs (float32, none / dflash / ddtree-16 / ddtree-64 + lookup, drafts adjusted and blind): a
   random token automaton over the tiny vocabulary on a greedy and a sampled request beside two free ones;
   every method gives none's tokens, the structured ones stay inside the automaton, the free ones keep the
   tokens they get in a batch without a structure (graphed), and rounds without a structured request replay
   graphs again; the structure kernels (treeflash/structure_kernel.py) give GrammarSlots' torch ops' node
   masks, drafts' masks and states, element for element, at vocabularies of 49,152 and 151,936.
R. prefix reuse (treeflash/prefix_reuse.py; graphs and overlap on, float32 and bfloat16, none / ddtree + lookup,
   splitkv and flex attention, 8-token prefill chunks): one request at a time through turns that share whole
   chunks, and two at a time (a short request beside a long one, so a freed slot is written over by rounds
   while the other runs): every token and log-prob equals the engine's with reuse off, and prompt tokens were
   reused (the two-at-a-time case is reported, not failed: its prefills batch other pieces than without reuse).
P. graphs sharing one memory pool: rounds hop between graphs (buckets, budgets 0-256, one pool, one capture
   stream) and equal the same rounds run eagerly; a round's read-back survives other graphs' replays; graphs
   captured one per stage (time_stages) write no tensor made after them.
T. the Triton tree builder (treeflash/tree_kernel.py) builds field for field the tree `build_tree` builds,
   on random log-probs at drafter shapes (15 depths, vocabularies of 16,384 and 49,152, budgets 1-512,
   1 and 8 slots, with and without ties); prompt lookup's kernel (treeflash/lookup_kernel.py) grafts
   field for field what `graft(tree, *lookup(...))` does (histories of 7-8,192 tokens, 1-32 slots); the walk
   and verify mask kernels (treeflash/walk_kernel.py) give what `walk` and `ancestor_mask` give (budgets 16-4,096).
G. with --timings: per-round milliseconds, eager vs graphed, at the SmolLM2-135M and Qwen3-8B shapes
   (random bf16 weights, context 1024, batch 1 and 8; AR step, dflash, ddtree 64/256), the stage
   split of graphed rounds, and the weight-read floor (weight bytes / 4.3 TB/s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treeflash import LLM, SamplingParams  # noqa: E402
from treeflash.models.dflash import DFlashDrafter, DrafterConfig, save_drafter  # noqa: E402
from treeflash.provenance import source_digest  # noqa: E402
from treeflash.round import SpecConfig, Speculator  # noqa: E402
from treeflash.runner import GraphRunner  # noqa: E402

PROMPTS = [[5, 17, 42, 8, 99, 3], [1, 2, 3], [7] * 20]
DEVICE = "cuda"  # --device cpu runs A, B and D here, to check the script itself


def tiny_targets(root: Path) -> dict[str, Path]:
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GptOssConfig, GptOssForCausalLM, LlamaConfig,
                              LlamaForCausalLM, MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, SmolLM3Config,
                              SmolLM3ForCausalLM)

    out = {}
    # (windows of 8 positions, shorter than the prompts and their tokens; GPT-OSS's on layers 0 and 2)
    for name, config_cls, model_cls, extra in [
            ("llama", LlamaConfig, LlamaForCausalLM, {}), ("qwen2", Qwen2Config, Qwen2ForCausalLM, {}),
            ("qwen3", Qwen3Config, Qwen3ForCausalLM, {}), ("mistral", MistralConfig, MistralForCausalLM,
                                                          {"sliding_window": 8}),
            ("gpt_oss", GptOssConfig, GptOssForCausalLM, {"sliding_window": 8, "num_local_experts": 8,
                                                          "num_experts_per_tok": 2, "intermediate_size": 64}),
            # (layer 1 NoPE, with the window)
            ("smollm3", SmolLM3Config, SmolLM3ForCausalLM, {
                "no_rope_layers": [1, 0, 1], "use_sliding_window": True, "sliding_window": 8, "pad_token_id": None,
                "bos_token_id": None, "eos_token_id": None}),
            # (fused projections, half of each head rotated with LongRoPE's short factors and cos/sin scale)
            ("phi3", Phi3Config, Phi3ForCausalLM, {
                "sliding_window": 8, "partial_rotary_factor": 0.5, "original_max_position_embeddings": 512,
                "pad_token_id": None, "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 8.0,
                                                          "short_factor": [1.0, 1.5, 2.0, 4.0],
                                                          "long_factor": [1.0, 2.0, 4.0, 8.0]}}),
            # (layers 0 and 1 windows with their own RoPE, layer 2 full; (1 + w) norms around attention and MLP)
            ("gemma3", Gemma3TextConfig, Gemma3ForCausalLM, {
                "sliding_window": 8, "query_pre_attn_scalar": 16, "pad_token_id": None, "bos_token_id": None,
                "eos_token_id": None, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]})]:
        torch.manual_seed(0)
        cfg = config_cls(**{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300,
                            "max_position_embeddings": 512, "tie_word_embeddings": name == "llama"} | extra)
        model = model_cls(cfg)
        with torch.no_grad():  # (GPT-OSS starts its biases and sinks at zero: a model ignoring them would pass)
            for pname, p in model.named_parameters():
                if pname.endswith(("bias", "sinks")) or (name == "gemma3" and "norm" in pname):
                    p.normal_(0, 0.5)
        model.save_pretrained(root / name)
        out[name] = root / name
    return out


def tiny_drafter(root: Path, block_size: int = 8) -> Path:
    torch.manual_seed(1)
    cfg = DrafterConfig.from_hf({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block_size,
        "dflash_config": {"mask_token_id": 299, "target_layer_ids": [0, 2]}, "num_target_layers": 3,
        "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": 512})
    return save_drafter(DFlashDrafter(cfg), root / "drafter")


def hf_greedy(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(DEVICE).eval()
    ids = torch.tensor([prompt], device=DEVICE)
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                         attention_mask=torch.ones_like(ids))
    return out[0, len(prompt):].tolist()


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def check_parity(targets: dict[str, Path]) -> dict:
    results = {}
    for name, path in targets.items():
        llm = LLM(path, device=DEVICE, dtype="float32")
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=greedy(32))
        results[name] = all(o.token_ids == hf_greedy(path, p, 32) for o, p in zip(outs, PROMPTS))
    return results


def check_speculative(target: Path, drafter: Path) -> dict:
    params = [greedy(40), greedy(25), greedy(33)]
    ref = LLM(target, device=DEVICE, dtype="float32").generate(prompt_token_ids=PROMPTS, sampling_params=params)
    results = {}
    for spec, budget in [("dflash", 64), ("ddtree", 4), ("ddtree", 16), ("ddtree", 64)]:
        llm = LLM(target, device=DEVICE, dtype="float32", draft_model=drafter, spec=spec, tree_budget=budget,
                  max_num_seqs=2)
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
        results[f"{spec}-{budget} greedy == none"] = all(o.token_ids == r.token_ids for o, r in zip(outs, ref))
    llm = LLM(target, device=DEVICE, dtype="float32", draft_model=drafter, spec="ddtree", tree_budget=16)
    seeded = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=30, seed=1234, ignore_eos=True)
    alone = llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=seeded)[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=20, seed=7, ignore_eos=True), greedy(12)]
    mixed = llm.generate(prompt_token_ids=[PROMPTS[1], PROMPTS[0], PROMPTS[2]],
                         sampling_params=[others[0], seeded, others[1]])[1].token_ids
    results["seeded sample reproducible alone / in a mixed batch"] = alone == mixed
    plain = LLM(target, device=DEVICE, dtype="float32").generate(prompt_token_ids=PROMPTS[:1], sampling_params=seeded)
    results["seeded sample identical with spec=none and ddtree"] = plain[0].token_ids == alone
    return results


# (method, prompt-lookup tokens) whose rounds C and F run under set_sync_debug_mode("error")
SYNC_SPECS = [("none", 0), ("dflash", 0), ("ddtree", 0), ("none", 6), ("ddtree", 6)]


def check_no_sync(target: Path, drafter: Path, attention: str = "flex") -> dict:
    results = {}
    for spec, ngram in SYNC_SPECS:
        llm = LLM(target, device=DEVICE, dtype="float32", draft_model=None if spec == "none" else drafter, spec=spec,
                  tree_budget=16, time_stages=False, ngram_tokens=ngram)
        speculator = mixed_speculator(llm, attention=attention)
        results[f"{spec}{' + lookup' if ngram else ''}: 3 eager rounds without host sync"] = \
            eager_rounds_without_sync(speculator, 4)
    return results


def eager_rounds_without_sync(speculator: Speculator, slots: int) -> bool | str:
    """True when three eager rounds over `slots` slots run under set_sync_debug_mode("error"); else what
    synchronised."""
    return _three_without_sync(lambda: speculator.round(slots))


def _three_without_sync(round_once) -> bool | str:
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
        for _ in range(3):
            round_once()
    except RuntimeError as e:
        return f"sync inside a round: {e}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return True


def mixed_speculator(llm: LLM, attention: str | None, capacity: int = 256, **extra) -> Speculator:
    """Four slots of a fresh speculator: greedy, fully filtered sampling, plain sampling, greedy (the second
    with `extra` SamplingParams fields: log-probs, penalties)."""
    speculator = Speculator(llm.model, llm.drafter, llm.spec, slots=4, capacity=capacity, time_stages=False,
                            attention=attention)
    params = [greedy(8), SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, seed=1, **extra),
              SamplingParams(temperature=1.0, seed=2), greedy(8)]
    for slot, (prompt, p) in enumerate(zip(PROMPTS + PROMPTS[:1], params)):
        speculator.admit(slot, prompt, p, seed=slot)
    return speculator


# --- T: the Triton tree builder ---------------------------------------------------------------------
def check_tree_kernel() -> dict:
    from treeflash.tree import build_tree
    from treeflash.top_k import top_k_filter, top_k_pieces
    from treeflash.tree_kernel import build_tree_kernel

    results = {}
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for slots, vocab, budget, ties in [(1, 16384, 16, False), (1, 16384, 64, False), (8, 16384, 64, True),
                                       (1, 49152, 256, False), (2, 16384, 512, True), (4, 16384, 1, False),
                                       (1, 100, 200, True), (2, 16384, 64, "certain"), (1, 151936, 64, False),
                                       (8, 151936, 16, True)]:
        lp = torch.randn(slots, 15, vocab, device=DEVICE, generator=gen) * 3
        if ties == "certain":  # a token of log-prob exactly 0.0 at the first 5 depths: prefixes scoring +0.0
            lp[:, :5, 11] = 200.0
        elif ties:  # few distinct values: ties everywhere, where a sort's order shows
            lp = lp.round()
        lp = lp.log_softmax(-1)
        bonus = torch.arange(slots, device=DEVICE) + 7
        # With ties (the certain tokens' rows have some far down) both builders take torch.topk's lists:
        # the kernel's own top-k ranks equal scores by token, torch.topk in an order of its own; that
        # top-k is checked on its own below.
        k = min(budget, vocab)
        top = lp.topk(k, dim=-1) if ties else None
        want, got = build_tree(bonus, lp, budget), build_tree_kernel(bonus, lp, budget, top=top)
        fields = ("tokens", "parents", "depths", "valid", "scores", "ranked_scores")
        label = {True: " ties", "certain": " certain tokens"}.get(ties, "")
        results[f"slots {slots} vocab {vocab} budget {budget}{label}"] = all(
            torch.equal(getattr(got, f), getattr(want, f)) for f in fields)
        x = lp.to(torch.bfloat16) if ties else lp  # bf16 rows, as a round drafts them: more ties
        order = (-x.float()).sort(dim=-1, stable=True).indices[..., :k]  # equal scores: the lower token
        for method in (top_k_pieces, top_k_filter):  # top_k_kernel takes one by the vocabulary
            scores, tokens = method(x, k)
            results[f"{method.__name__} slots {slots} vocab {vocab} k {k}{label}: a stable top-k"] = (
                torch.equal(tokens, order) and torch.equal(scores, x.float().gather(-1, order)))
    results.update(check_lookup_kernel())
    results.update(check_walk_kernel())
    return results


def check_walk_kernel() -> dict:
    """The walk and the verify mask as one kernel each (treeflash/walk_kernel.py) == `walk` / `ancestor_mask`."""
    from treeflash.lookup import graft_lookup
    from treeflash.tree import ancestor_mask, build_chain, build_tree, root_only, walk
    from treeflash.walk_kernel import ancestor_mask_kernel, walk_kernel

    results = {}
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    for slots, budget in [(1, 64), (8, 64), (32, 16), (1, 256), (2, 512), (3, 4096)]:
        lp = torch.randn(slots, 15, 64, device=DEVICE, generator=gen).log_softmax(-1)
        bonus = torch.randint(0, 64, (slots,), device=DEVICE, generator=gen)
        history = torch.randint(0, 4, (slots, 512), device=DEVICE, generator=gen)
        seq_lens = torch.full((slots,), 400, device=DEVICE)
        tree = build_tree(bonus, lp, budget)
        for name, t in [("root", root_only(bonus)), ("chain", build_chain(bonus, lp)), (f"ddtree-{budget}", tree),
                        (f"ddtree-{budget} + lookup 8", graft_lookup(tree, history, seq_lens, bonus, 8))]:
            derived = torch.randint(0, 64, t.tokens.shape, device=DEVICE, generator=gen)
            # Deep paths: each node's derived token is one of its children's (the last child written wins).
            derived.scatter_(1, t.parents[:, 1:], t.tokens[:, 1:])
            want, got = walk(t, derived), walk_kernel(t, derived)
            results[f"walk kernel slots {slots} {name}: == walk (accepted up to {int(want.accepted.max())})"] = all(
                torch.equal(getattr(got, f), getattr(want, f)) for f in ("path", "accepted", "emitted"))
            results[f"mask kernel slots {slots} {name}: == ancestor_mask"] = torch.equal(
                ancestor_mask_kernel(t), ancestor_mask(t))
    return results


def check_lookup_kernel() -> dict:
    """Prompt lookup + graft as one kernel (treeflash/lookup_kernel.py) == the torch ops, field for field."""
    from treeflash.lookup import graft, graft_lookup, lookup
    from treeflash.tree import build_chain, build_tree, root_only

    results = {}
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    fields = ("tokens", "parents", "depths", "valid", "scores", "ranked_scores")
    for slots, capacity, vocab in [(1, 1024, 8), (8, 1024, 50), (32, 8192, 20), (3, 8192, 49152), (4, 7, 3)]:
        history = torch.randint(0, vocab, (slots + 2, capacity), device=DEVICE, generator=gen)[:slots]
        seq_lens = torch.randint(0, capacity + 1, (slots,), device=DEVICE, generator=gen)
        seq_lens[0] = capacity  # a full history: the root in lookup's extra column
        bonus = torch.randint(0, vocab, (slots,), device=DEVICE, generator=gen)
        lp = torch.randn(slots, 15, vocab, device=DEVICE, generator=gen).log_softmax(-1)
        for name, tree in [("root", root_only(bonus)), ("chain", build_chain(bonus, lp)),
                           ("ddtree-64", build_tree(bonus, lp, 64))]:
            for tokens in (1, 8, 64):
                want = graft(tree, *lookup(history, seq_lens, bonus, tokens))
                got = graft_lookup(tree, history, seq_lens, bonus, tokens)
                same = all((getattr(got, f) is None and getattr(want, f) is None)
                           or torch.equal(getattr(got, f), getattr(want, f)) for f in fields)
                results[f"lookup kernel slots {slots} capacity {capacity} vocab {vocab} {name} tokens {tokens}: "
                        f"== graft(lookup)"] = same and got.max_depth == want.max_depth
    return results


# --- E, F: CUDA graphs -------------------------------------------------------------------------------
def check_graphs_equal_eager(target: Path, drafter: Path, attentions=("flex", "sdpa", "splitkv", "hybrid")) -> dict:
    results = {}
    # Four requests in four slots, the longest last: every round runs at batch 4, graphed or not.
    prompts = PROMPTS + [[11, 13, 17, 19, 23]]
    params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_tokens=30, seed=1234, ignore_eos=True),
              SamplingParams(temperature=1.0, min_p=0.05, max_tokens=25, seed=7, ignore_eos=True),
              greedy(40), greedy(48)]
    for attention in attentions if DEVICE == "cuda" else ("sdpa",):
        reference = None
        for spec, budget, tree_kernel, ngram in [("none", 64, False, 0), ("dflash", 64, False, 0),
                                                 ("ddtree", 16, False, 0), ("ddtree", 64, False, 0),
                                                 ("ddtree", 64, True, 0), ("ddtree", 256, True, 0),
                                                 ("none", 64, False, 6), ("ddtree", 64, True, 6)]:
            if tree_kernel and DEVICE != "cuda":  # a Triton kernel: CUDA only (the tests run it interpreted)
                continue
            outs = {}
            for graphs in (True, False):
                llm = LLM(target, device=DEVICE, dtype="float32", draft_model=None if spec == "none" else drafter,
                          spec=spec, tree_budget=budget, max_num_seqs=4, cuda_graphs=graphs, attention=attention,
                          ngram_tokens=ngram)
                llm.engine.speculator.tree_kernel = tree_kernel  # before the first round (and capture)
                outs[graphs] = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                                  use_tqdm=False)]
            name = f"{attention} {spec}-{budget}" + (" tree kernel" if tree_kernel else "") + \
                (f" + lookup {ngram}" if ngram else "")
            results[f"{name}: graphed == eager (greedy + seeded sampling)"] = outs[True] == outs[False]
            reference = reference or outs[True]
            if spec != "none" or ngram:
                results[f"{name}: greedy (graphed) == none"] = outs[True][2:] == reference[2:]
                results[f"{name}: seeded samples == none (informational: equal up to "
                        f"float rounding at a CDF boundary)"] = str(outs[True][:2] == reference[:2])
    # Overlapped rounds with slots reused: four requests through two slots, graphed (overlap on) vs eager.
    outs = {}
    for graphs in (True, False):
        llm = LLM(target, device=DEVICE, dtype="float32", draft_model=drafter, spec="ddtree", tree_budget=16,
                  max_num_seqs=2, cuda_graphs=graphs)
        outs[graphs] = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                          use_tqdm=False)]
        if graphs:  # (graphs, hence overlap, on CUDA only)
            overlaps = llm.engine.overlap == (DEVICE == "cuda")
            results["ddtree-16, 2 slots: overlap on exactly where graphs run"] = overlaps
    results["ddtree-16, 2 slots: graphed with overlap == eager"] = outs[True] == outs[False]
    plain = LLM(target, device=DEVICE, dtype="float32", max_num_seqs=2).generate(
        prompt_token_ids=PROMPTS, sampling_params=greedy(40), use_tqdm=False)
    auto = LLM(target, device=DEVICE, dtype="float32", draft_model=drafter, max_num_seqs=1, attention="sdpa",
               time_stages=False)
    got = auto.generate(prompt_token_ids=PROMPTS, sampling_params=greedy(40), use_tqdm=False)
    results["sdpa ddtree-auto greedy (graphed) == none"] = [o.token_ids for o in got] == [o.token_ids for o in plain]
    results["auto budget profile (batch 1, ms)"] = {b: round(1e3 * c, 3) for b, c in
                                                    auto.engine.budget.profile.seconds.get(1, {}).items()}
    return results


def check_no_sync_in_replay(target: Path, drafter: Path, attention: str = "flex") -> dict:
    results = {}
    for spec, ngram in SYNC_SPECS:
        llm = LLM(target, device=DEVICE, dtype="float32", draft_model=None if spec == "none" else drafter, spec=spec,
                  tree_budget=16, time_stages=False, ngram_tokens=ngram)
        speculator = mixed_speculator(llm, attention=attention)
        for time_stages in (False, True):
            runner = GraphRunner(speculator, time_stages=time_stages, log=None)
            label = "staged graphs" if time_stages else "one graph"
            results[f"{spec}{' + lookup' if ngram else ''}: 3 replays ({label}) without host sync"] = \
                replays_without_sync(runner, 4)
    return results


def replays_without_sync(runner: GraphRunner, slots: int) -> bool | str:
    """True when three replays of the round over `slots` slots (captured first, outside the check) run under
    set_sync_debug_mode("error"); else what synchronised."""
    runner.round(slots)
    return _three_without_sync(lambda: runner.round(slots))


# --- S: structured outputs -----------------------------------------------------------------------------
def check_prefix_reuse(target: Path, drafter: Path) -> dict:
    rng = random.Random(3)
    base = [rng.randrange(1, 298) for _ in range(53)]
    turns = [base + [5, 6, 7], base + list(range(5, 15)), base + [9], [rng.randrange(1, 298) for _ in range(40)],
             base[:20] + [1, 2, 3], base + list(range(5, 18))]
    pair = [base + [40, 41], base[:30] + [50] * 10]
    params = SamplingParams(temperature=0, max_tokens=16, logprobs=2, ignore_eos=True)
    results = {}
    for dtype in ("float32", "bfloat16"):
        for spec, ngram, attention in [("none", 0, None), ("ddtree", 6, None), ("ddtree", 6, "flex")]:
            if DEVICE != "cuda" and (attention or dtype == "bfloat16"):
                continue  # (--device cpu checks the script: the CPU runs sdpa, in float32)
            name = f"{dtype} {spec}" + (" + lookup" if ngram else "") + f", {attention or 'default'} attention"
            runs = {}
            for reuse in (True, False):
                llm = LLM(target, device=DEVICE, dtype=dtype, draft_model=None if spec == "none" else drafter,
                          spec=spec, max_num_seqs=4, ngram_tokens=ngram, attention=attention,
                          enable_prefix_caching=reuse, **({"tree_budget": 16} if spec == "ddtree" else {}))
                llm.engine.config = dataclasses.replace(llm.engine.config, prefill_chunk=8)
                one = [llm.generate(prompt_token_ids=[t], sampling_params=params, use_tqdm=False)[0] for t in turns]
                two = llm.generate(prompt_token_ids=pair, sampling_params=[
                    params, dataclasses.replace(params, max_tokens=40)], use_tqdm=False)
                runs[reuse] = (one, two, llm.engine.stats.reused_prompt_tokens)

            def same(a, b) -> bool:
                return [o.token_ids for o in a] == [o.token_ids for o in b] and \
                    [[{t: e.logprob for t, e in x.items()} for x in o.logprobs] for o in a] == \
                    [[{t: e.logprob for t, e in x.items()} for x in o.logprobs] for o in b]

            (one, two, reused), (one_off, two_off, _) = runs[True], runs[False]
            results[f"{name}: one at a time, tokens and log-probs == reuse off"] = same(one, one_off)
            results[f"{name}: one at a time, prompt tokens reused"] = [o.num_cached_tokens for o in one]
            results[f"{name}: prompt tokens were reused"] = reused > 0
            results[f"{name}: two at a time"] = ("equal" if same(two, two_off) else "differ") + \
                f" (reused {[o.num_cached_tokens for o in two]})"
    return results


def check_structured(target: Path, drafter: Path) -> dict:
    import random

    from treeflash.structured import Grammar, GrammarSlots

    rng = random.Random(0)
    vocab, states = 300, 6
    table = {s: {t: rng.randrange(states) for t in rng.sample(range(vocab), 40)} for s in range(states)}
    grammar = Grammar.from_table(vocab, 0, table)

    class Fixed:  # (the tiny models have no tokenizer: the automaton is given, not compiled)
        def compile(self, params, stop_ids):  # a new object per request: the table places each one, and grows
            return dataclasses.replace(grammar)

        def close(self):
            pass

    structured = {"regex": "(the automaton above)"}
    params = [dataclasses.replace(greedy(30), structured_outputs=structured),
              SamplingParams(temperature=0.9, max_tokens=30, seed=5, ignore_eos=True, structured_outputs=structured),
              greedy(30), SamplingParams(temperature=0.8, max_tokens=30, seed=9, ignore_eos=True)]
    prompts = PROMPTS + [[11, 13, 17, 19, 23]]
    results, reference = {}, None
    min_rows = GrammarSlots.MIN_ROWS
    GrammarSlots.MIN_ROWS = 8  # (room for one automaton: the second grows the table, and the graphs go)
    try:
        for spec, budget, ngram in [("none", 64, 0), ("dflash", 64, 0), ("ddtree", 16, 0), ("ddtree", 64, 6)]:
            for adjust, graphs in ((True, True), (False, True), (True, False)):
                llm = LLM(target, device=DEVICE, dtype="float32", draft_model=None if spec == "none" else drafter,
                          spec=spec, max_num_seqs=4, ngram_tokens=ngram, cuda_graphs=graphs,
                          **({"tree_budget": budget} if spec == "ddtree" else {}))
                llm.tokenizer, llm._grammars = _TokenWords(), Fixed()
                llm.engine.speculator.adjust_drafts = adjust
                free = [o.token_ids for o in llm.generate(prompt_token_ids=prompts[2:], sampling_params=params[2:],
                                                          use_tqdm=False)]
                tokens = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                            use_tqdm=False)]
                again = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                           use_tqdm=False)]
                name = f"{spec}-{budget}" + (f" + lookup {ngram}" if ngram else "") + \
                    ("" if adjust else ", blind drafts") + ("" if graphs else ", eager")
                reference = reference or tokens
                results[f"{name}: == none's tokens"] = tokens == reference
                results[f"{name}: the same again (the table repacked, in place)"] = again == tokens
                ok = True
                for out in tokens[:2]:
                    state = 0
                    for t in out:
                        if t not in table[state]:
                            ok = False
                            break
                        state = table[state][t]
                results[f"{name}: structured tokens follow the automaton"] = ok
                results[f"{name}: the free requests keep their tokens"] = tokens[2:] == free
                if graphs and DEVICE == "cuda":
                    keys = [k for k in llm.engine.runner.graphs if k[3].use_structure]
                    results[f"{name}: structured rounds replay graphs"] = bool(keys)
                    results[f"{name}: the table grew"] = llm.engine.speculator.structure.generation > 1
    finally:
        GrammarSlots.MIN_ROWS = min_rows
    if DEVICE == "cuda":
        results.update(structure_kernels_against_ops())
        for spec, ngram in SYNC_SPECS:
            llm = LLM(target, device=DEVICE, dtype="float32", draft_model=None if spec == "none" else drafter,
                      spec=spec, tree_budget=16, time_stages=False, ngram_tokens=ngram)
            speculator = mixed_speculator(llm, attention=None)
            speculator.set_sampling_many([1], [params[1]], [1], [PROMPTS[1]], [set()], grammars=[grammar])
            name = f"{spec}{' + lookup' if ngram else ''}, a structured slot"
            results[f"{name}: 3 eager rounds without host sync"] = eager_rounds_without_sync(speculator, 4)
            results[f"{name}: 3 replays without host sync"] = replays_without_sync(
                GraphRunner(speculator, time_stages=False, log=None), 4)
    return results


def structure_kernels_against_ops() -> dict:
    """treeflash/structure_kernel.py against GrammarSlots' torch ops on the GPU, at real vocabularies: each
    node's mask in DDTree-64 trees (drafted over a draft vocabulary), the drafts' chain masks over it and
    over the whole vocabulary, and the states after emitted tokens; a dense automaton (a third of the
    vocabulary allowed in each state), a sparse one (20 tokens) and a slot without a structure."""
    from treeflash.structured import Grammar, GrammarSlots
    from treeflash.tree import build_tree

    results, rng = {}, random.Random(1)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    for vocab, draft in ((49152, 16384), (151936, 32768)):
        grammars = [Grammar.from_table(vocab, 0, {s: {t: rng.randrange(6) for t in rng.sample(range(vocab), k)}
                                                  for s in range(6)}) for k in (vocab // 3, 20)] + [None]
        kernel, ops = (GrammarSlots(3, vocab, DEVICE, kernels=k) for k in (True, False))
        columns = torch.randperm(vocab, device=DEVICE, generator=gen)[:draft].sort().values
        same = {"node masks": True, "draft masks, draft vocabulary": True, "draft masks, whole vocabulary": True,
                "states after emitted tokens": True}
        for structure in (kernel, ops):
            structure.start([0, 1, 2], grammars)
        for _ in range(4):
            drafts = torch.randn(3, 15, draft, device=DEVICE, generator=gen).to(torch.bfloat16) * 3
            tree = build_tree(torch.zeros(3, dtype=torch.long, device=DEVICE), torch.log_softmax(drafts.float(), -1),
                              budget=64)
            tree = dataclasses.replace(tree, tokens=torch.cat([tree.tokens[:, :1], columns[tree.tokens[:, 1:]]], 1))
            logits = torch.randn(3, tree.size, vocab, device=DEVICE, generator=gen).to(torch.bfloat16)
            same["node masks"] &= torch.equal(*(s.apply(logits, slice(0, 3), tree) for s in (kernel, ops)))
            same["draft masks, draft vocabulary"] &= torch.equal(
                *(s.apply_drafts(drafts, slice(0, 3), columns) for s in (kernel, ops)))
            whole = torch.randn(3, 15, vocab, device=DEVICE, generator=gen)
            same["draft masks, whole vocabulary"] &= torch.equal(
                *(s.apply_drafts(whole, slice(0, 3)) for s in (kernel, ops)))
            emitted = torch.stack([tree.tokens[:, 0]] + [tree.tokens[:, 1 + d] for d in range(15)], 1)
            accepted = torch.randint(0, 17, (3,), device=DEVICE, generator=gen)
            for s in (kernel, ops):
                s.add(emitted, accepted)
            same["states after emitted tokens"] &= torch.equal(kernel.state, ops.state)
        for what, ok in same.items():
            results[f"structure kernels, vocabulary {vocab}: {what} == torch ops'"] = bool(ok)
    return results


def penalty_kernel_against_ops() -> dict:
    """treeflash/penalty_kernel.py against `penalize`'s torch ops on the GPU, bit for bit, at vocabularies of
    49,152 and 151,936: every node of DDTree-64 trees (its drafted path), the drafts (no path), the prefill
    (no output yet), bfloat16 and float32 logits, and rows with and without penalties."""
    from treeflash.penalties import penalize
    from treeflash.sampling import SamplingTensors
    from treeflash.tree import ancestor_mask, build_tree

    params = [SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3), SamplingParams(),
              SamplingParams(repetition_penalty=0.7, frequency_penalty=-1.2), SamplingParams(repetition_penalty=1.05)]
    st = SamplingTensors.build(params, [0] * len(params), DEVICE)
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    results = {}
    for vocab in (49152, 151936):
        s = len(params)
        output = torch.randint(0, 4, (s, vocab), dtype=torch.int32, device=DEVICE, generator=gen)
        output *= torch.rand(s, vocab, device=DEVICE, generator=gen) < 0.01
        prompt = torch.rand(s, vocab, device=DEVICE, generator=gen) < 0.01
        same = True
        for dtype in (torch.bfloat16, torch.float32):
            drafts = torch.randn(s, 15, vocab, device=DEVICE, generator=gen) * 3
            drafts[:, :, :64] += 8  # (drafted tokens among the few the output and prompt hold: repeats on paths)
            tree = build_tree(torch.zeros(s, dtype=torch.long, device=DEVICE), torch.log_softmax(drafts, -1), budget=64)
            logits = (torch.randn(s, tree.size, vocab, device=DEVICE, generator=gen) * 4).to(dtype)
            penalties = (st.repetition, st.frequency, st.presence)
            for args in ((output, prompt, tree.tokens, ancestor_mask(tree), tree), (output, prompt), (None, prompt)):
                got = penalize(logits, *penalties, *args, kernel=True)
                same &= torch.equal(got, penalize(logits, *penalties, *args[:4], kernel=False))
            same &= torch.equal(penalize(drafts.to(dtype), *penalties, output, prompt, kernel=True),
                                penalize(drafts.to(dtype), *penalties, output, prompt, kernel=False))
        results[f"penalty kernel, vocabulary {vocab}: == the torch ops bit for bit"] = bool(same)
    return results


# --- L: log-probs ------------------------------------------------------------------------------------
class _TokenWords:
    """A tokenizer whose words are token ids ("17 4" is [17, 4]): bad words on the tiny models."""

    def encode(self, text, add_special_tokens=False):
        return [int(t) for t in text.split()]

    def decode(self, ids):
        return " ".join(map(str, ids))


def check_logprobs(target: Path, drafter: Path, attention: str | None, shapes: list[str]) -> dict:
    results = {}
    prompts = PROMPTS + [[11, 13, 17, 19, 23]]
    plain = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=30, seed=1234, ignore_eos=True), greedy(40),
             greedy(33), SamplingParams(temperature=1.0, min_p=0.05, max_tokens=25, seed=7, ignore_eos=True)]
    asked = [dataclasses.replace(plain[0], logprobs=5), plain[1], dataclasses.replace(plain[2], logprobs=0), plain[3]]
    penalties = dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3, logit_bias={5: 3.0, 9: -100.0},
                     min_tokens=6, stop_token_ids=[7])
    penalised = [dataclasses.replace(plain[0], **penalties), dataclasses.replace(plain[1], **penalties), plain[2],
                 plain[3]]
    allowed = [1, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233]
    # allowed_token_ids on a sample and a greedy request; prompt log-probs on a third (its prefill eager)
    # and bad words on a fourth (a one-token word and two-token ones drawn from its free answer, below)
    masked = [dataclasses.replace(plain[0], allowed_token_ids=allowed), dataclasses.replace(plain[1],
              allowed_token_ids=allowed[:4], logit_bias={3: 2.0}), dataclasses.replace(plain[2], prompt_logprobs=3),
              plain[3]]
    hf = None
    reference = masked_reference = None
    for spec, budget, ngram in [("none", 64, 0), ("dflash", 64, 0), ("ddtree", 16, 0), ("ddtree", 64, 6)]:
        outs = {}
        for graphs, params in ((True, plain), (True, asked), (False, asked), (True, penalised), (False, penalised),
                               (True, masked), (False, masked)):
            llm = LLM(target, device=DEVICE, dtype="float32", draft_model=None if spec == "none" else drafter,
                      spec=spec, max_num_seqs=4, cuda_graphs=graphs, attention=attention, ngram_tokens=ngram,
                      **({"tree_budget": budget} if spec == "ddtree" else {}))
            llm.tokenizer = _TokenWords()  # (bad words are tokenised: these "words" are token ids)
            if params is masked and masked[3].bad_words is None:
                free = outs[True, id(plain)][3].token_ids
                masked[3] = dataclasses.replace(plain[3], bad_words=[str(free[4]), f"{free[7]} {free[8]}",
                                                                     f"{free[10]} {free[11]}"])
            outs[graphs, id(params)] = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        name = f"{spec}-{budget}" + (f" + lookup {ngram}" if ngram else "")
        tokens = {k: [o.token_ids for o in v] for k, v in outs.items()}
        a, p = id(asked), id(penalised)
        results[f"{name}: asking for log-probs changes no token (graphed)"] = tokens[True, a] == tokens[True, id(plain)]
        results[f"{name}: graphed == eager with log-probs"] = tokens[True, a] == tokens[False, a]
        diff = max(abs(x[t].logprob - y[t].logprob) for i in (0, 2) for o, r in [(outs[True, a][i], outs[False, a][i])]
                   for x, y, t in zip(o.logprobs, r.logprobs, o.token_ids))
        results[f"{name}: graphed log-probs within 1e-5 of eager (max {diff:.1e})"] = diff <= 1e-5
        results[f"{name}: log-probs only where asked, one per token"] = (
            [o.logprobs is None for o in outs[True, a]] == [False, True, False, True]
            and all(len(o.logprobs) == len(o.token_ids) for o in outs[True, a][::2]))
        if hf is None:
            from transformers import AutoModelForCausalLM

            hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).to(DEVICE).eval()
        worst = 0.0
        for prompt, out in zip(prompts[::2], outs[True, a][::2]):
            with torch.no_grad():
                ref = torch.log_softmax(hf(torch.tensor([prompt + out.token_ids], device=DEVICE)).logits[0].float(), -1)
            worst = max(worst, max(abs(e[t].logprob - ref[len(prompt) - 1 + j, t].item())
                                   for j, (t, e) in enumerate(zip(out.token_ids, out.logprobs))))
        results[f"{name}: log-probs within 1e-3 of transformers (max {worst:.1e})"] = worst <= 1e-3
        # Penalties: graphed == eager; the unpenalised requests keep their tokens; greedy ones equal plain decoding's.
        results[f"{name}: graphed == eager with penalties"] = tokens[True, p] == tokens[False, p]
        results[f"{name}: requests without penalties keep their tokens"] = tokens[True, p][2:] == tokens[True, id(plain)][2:]
        reference = reference or tokens[True, p]
        results[f"{name}: penalised greedy (graphed) == none's"] = tokens[True, p][1] == reference[1]
        if spec == "none":
            want = hf.generate(torch.tensor([prompts[1]], device=DEVICE), max_new_tokens=40, do_sample=False,
                               repetition_penalty=1.3, pad_token_id=0)[0, len(prompts[1]):].tolist()
            alone = LLM(target, device=DEVICE, dtype="float32").generate(
                prompt_token_ids=[prompts[1]], sampling_params=dataclasses.replace(plain[1], repetition_penalty=1.3),
                use_tqdm=False)[0].token_ids
            results["none: repetition-penalty greedy (graphed) == transformers"] = alone == want
            results["none: the logit bias of -100 kept its token out"] = all(9 not in t for t in tokens[True, p][:2])
        # allowed_token_ids and prompt log-probs
        m = id(masked)
        results[f"{name}: graphed == eager with allowed_token_ids and prompt log-probs"] = tokens[True, m] == tokens[False, m]
        results[f"{name}: only allowed tokens drawn"] = set(tokens[True, m][0]) <= set(allowed) and \
            set(tokens[True, m][1]) <= set(allowed[:4])
        results[f"{name}: the request without a mask keeps its tokens"] = tokens[True, m][2] == tokens[True, id(plain)][2]
        masked_reference = masked_reference or tokens[True, m]
        results[f"{name}: masked greedy (graphed) == none's"] = tokens[True, m][1] == masked_reference[1]
        words = [[int(t) for t in w.split()] for w in masked[3].bad_words]
        out = tokens[True, m][3]
        results[f"{name}: no bad word in the bad-words sample, and it changed"] = out != tokens[True, id(plain)][3] and \
            not any(out[i:i + len(w)] == w for w in words for i in range(len(out)))
        results[f"{name}: bad-words sample (graphed) == none's"] = out == masked_reference[3]
        scored = [o.prompt_logprobs for o in (outs[True, m][2], outs[False, m][2])]
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([prompts[2]], device=DEVICE)).logits[0].float(), -1)
        worst = max(abs(e[t].logprob - ref[j, t].item()) for j, (t, e) in enumerate(zip(prompts[2][1:], scored[0][1:])))
        results[f"{name}: prompt log-probs within 1e-3 of transformers (max {worst:.1e})"] = (
            worst <= 1e-3 and scored[0][0] is None and len(scored[0]) == len(prompts[2]))
        results[f"{name}: graphed run's prompt log-probs == eager run's"] = all(
            (a is None and b is None) or {t: x.logprob for t, x in a.items()} == {t: x.logprob for t, x in b.items()}
            for a, b in zip(*scored))
    if DEVICE == "cuda":
        # The drafts' log-softmax over rows a request's mask leaves mostly -inf (adjusted drafts): whole
        # 4,096-token pieces of a row masked, every 5,000th token finite.
        from treeflash.vocab_rows import log_softmax_rows

        gen = torch.Generator(device=DEVICE).manual_seed(0)
        x = torch.randn(2, 15, 151936, device=DEVICE, generator=gen) * 3
        keep = torch.zeros_like(x, dtype=torch.bool)
        keep[..., ::5000] = True
        x = x.masked_fill(~keep, float("-inf"))
        for temperature in (None, torch.tensor([0.7, 1.3], device=DEVICE)):
            got = log_softmax_rows(x, temperature)
            ref = torch.log_softmax(x if temperature is None else x / temperature[:, None, None], -1)
            results[f"log_softmax_rows, whole pieces masked, temperature {temperature is not None}: no NaN, "
                    f"-inf where masked, torch's elsewhere"] = bool(
                not got.isnan().any() and torch.isneginf(got[~keep]).all()
                and torch.allclose(got[keep], ref[keep], atol=1e-5))
        for what, extra in (("log-probs", {"logprobs": 3}), ("penalties, logit_bias, min_tokens", penalties)):
            llm = LLM(target, device=DEVICE, dtype="float32", draft_model=drafter, spec="ddtree", tree_budget=16,
                      time_stages=False)
            speculator = mixed_speculator(llm, attention=attention, **extra)
            results[f"ddtree-16 with {what}: 3 replays without host sync"] = \
                replays_without_sync(GraphRunner(speculator, log=None), 4)
    if DEVICE == "cuda":
        results.update(penalty_kernel_against_ops())
    for name in shapes:  # graphed round times without / with log-probs / with penalties (informational)
        target_model, drafter_model = build_shape(name)
        # A random automaton of 6 states over the vocabulary, a third of it allowed in each: JSON-like masks.
        import functools

        import treeflash.round as round_module
        from treeflash.penalties import penalize
        from treeflash.structured import Grammar

        vocab, pick = target_model.config.vocab_size, random.Random(0)
        grammar = Grammar.from_table(vocab, 0, {s: {t: pick.randrange(6) for t in pick.sample(range(vocab), vocab // 3)}
                                                for s in range(6)})
        structure = {"structured_outputs": {"regex": "(the automaton above)"}}
        for batch in (1, 8):
            for method, budget in (("none", 64), ("ddtree", 64)):
                sp = filled_speculator(target_model, drafter_model, SpecConfig(method, budget), batch, 1024, attention)
                row = {}
                allowed = {"allowed_token_ids": list(range(0, 1000, 3))}
                for what, extra, adjust in (("plain", {}, True), ("log-probs", {"logprobs": 5}, True),
                                            ("penalties, logit_bias, min_tokens", penalties, True),
                                            ("penalties, logit_bias, min_tokens, torch ops", penalties, True),
                                            ("the same, blind drafts", penalties, False),
                                            ("repetition_penalty 1.05", {"repetition_penalty": 1.05}, True),
                                            ("repetition_penalty 1.05, torch ops", {"repetition_penalty": 1.05},
                                             True),
                                            ("allowed_token_ids", allowed, True),
                                            ("allowed_token_ids, blind drafts", allowed, False),
                                            ("bad_words", {"bad_words": ["(three sequences)"]}, True),
                                            ("structured outputs", structure, True),
                                            ("structured outputs, torch ops", structure, True),
                                            ("structured outputs, eager", structure, True)):
                    sp.adjust_drafts = adjust
                    sp.set_sampling_many(list(range(batch)), [SamplingParams(temperature=0, **extra)] * batch,
                                         [0] * batch, [[1, 2, 3]] * batch, [{7}] * batch,
                                         [[[5], [7, 9], [1, 2, 3]]] * batch, [grammar] * batch)
                    ops = what.endswith("torch ops")  # (the kernels, or the torch ops they replace)
                    if sp.structure is not None:
                        sp.structure.kernels = not ops
                    round_module.penalize = functools.partial(penalize, kernel=False) if ops else penalize
                    try:
                        runner = GraphRunner(sp, log=None, enabled=not what.endswith("eager"))
                        row[what] = round(1e3 * runner.time_round(batch, 10), 3)
                    finally:
                        round_module.penalize = penalize
                results[f"{name} batch {batch} {method}-{budget}: graphed ms"] = str(row)
                del sp
                torch.cuda.empty_cache()
        del target_model, drafter_model
        torch.cuda.empty_cache()
    return results


# --- P: graphs sharing one memory pool -------------------------------------------------------------
POOL_ROUNDS = [(4, 16), (2, 64), (4, 0), (1, 256), (4, 4), (2, 8), (1, 32), (4, 64), (2, 0), (1, 16)] * 3


def check_shared_pool(target: Path, drafter: Path, attention: str | None = None) -> dict:
    """Every capture is recorded into one pool on one stream, so a replay may overwrite blocks other graphs
    freed while they were captured. Rounds hop between graphs (buckets 1 / 2 / 4, budgets 0-256) against the
    same rounds eagerly: equal read-backs, trees and walks (read right after each round), and every read-back
    left as it was by the later rounds' replays of other graphs."""
    llm = LLM(target, device=DEVICE, dtype="float32", draft_model=drafter, spec="ddtree", tree_budget="auto",
              time_stages=False)
    graphed, eager = (mixed_speculator(llm, attention, capacity=1024) for _ in range(2))  # (trees of 257 rows)
    runner = GraphRunner(graphed, log=None)
    if DEVICE == "cuda" and not runner.enabled:
        return {"error": "graphs are off"}
    equal, kept = _hop(runner, graphed, eager)
    keys = sorted({runner.key(runner.bucket(n), b) for n, b in POOL_ROUNDS}, key=str)
    hops = f"{len(POOL_ROUNDS)} rounds over {len(keys)} graphs in one pool"
    results = {f"{hops} == eager (read-back, tree, walk, state)": equal,
               "each round's read-back kept through other graphs' later replays": kept,
               "graphs": len(runner.graphs)}
    # The control: the same with the read-back left in the pool (the round ignores the runner's buffer).
    graphed, eager = (mixed_speculator(llm, attention, capacity=1024) for _ in range(2))
    round_ = graphed.round
    graphed.round = lambda *a, readback_out=None, **k: round_(*a, **k)
    _, kept = _hop(GraphRunner(graphed, log=None), graphed, eager)
    results["control, read-back inside the pool: kept (informational; False shows the hazard is real)"] = str(kept)
    results.update(check_stage_graphs_write_only_their_own(llm, attention))
    return results


def check_stage_graphs_write_only_their_own(llm: LLM, attention: str | None) -> dict:
    """A round captured one graph per stage (time_stages) gives each stage one kernel of its own, on a tensor
    made outside the pool: it must outlive the graphs, or its freed block goes to the next allocation and
    every replay adds 1 there. Small tensors made after the captures stay 0 through replays."""
    sp = mixed_speculator(llm, attention)
    runner = GraphRunner(sp, time_stages=True, log=None)
    for n, budget in ((4, 16), (2, 4), (1, 0)):
        runner.round(n, budget)
    probes = [torch.zeros(1, device=DEVICE) for _ in range(256)]  # small blocks, as a freed one-float tensor's
    for _ in range(3):
        for n, budget in ((4, 16), (2, 4), (1, 0)):
            runner.round(n, budget)
    untouched = all(int(p.item()) == 0 for p in probes)
    return {"stage graphs' replays leave tensors made after their capture alone": untouched,
            "stage graphs": sum(len(c.graphs) for c in runner.graphs.values())}


def _hop(runner: GraphRunner, graphed: Speculator, eager: Speculator) -> tuple[bool, bool]:
    equal, kept, held = True, True, {}  # held: per graph, its last read-back and what it should hold
    for n, budget in POOL_ROUNDS:
        g, e = runner.round(n, budget), eager.round(n, budget)
        equal &= all(torch.equal(a[:n], b[:n]) for a, b in [
            (g.readback, e.readback), (g.tree.tokens, e.tree.tokens), (g.tree.parents, e.tree.parents),
            (g.walk.emitted, e.walk.emitted), (graphed.state.seq_lens, eager.state.seq_lens),
            (graphed.state.bonus, eager.state.bonus)])
        key = runner.key(runner.bucket(n), budget)
        held.pop(key, None)  # (its own graph rewrites it)
        kept &= all(torch.equal(rows[:len(want)], want) for rows, want in held.values())
        held[key] = (g.readback, e.readback.clone())
    return equal, kept


# --- G: timings ------------------------------------------------------------------------------------
COPY_BANDWIDTH = 4.3e12  # bytes/s, measured device-to-device copy on this H200 (resources.md)
SHAPES = {
    "tiny": ({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "max_position_embeddings": 4096}, 299),  # --device cpu dry runs of this script
    "smollm2-135m": ({"architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 576,
                      "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                      "num_key_value_heads": 3, "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
                      "tie_word_embeddings": True, "max_position_embeddings": 8192}, 3),
    "qwen3-8b": ({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 4096,
                  "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                  "tie_word_embeddings": False, "max_position_embeddings": 40960}, 151669),
}


def build_shape(name: str):
    """Random bf16 target and a 5-layer, block-16 DFlash drafter at a real shape, built on the GPU."""
    from treeflash.config import ModelConfig
    from treeflash.models.transformer import Transformer

    hf, mask = SHAPES[name]
    cfg = ModelConfig.from_hf(hf)
    n = cfg.num_layers
    dcfg = DrafterConfig.from_hf({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
        "dflash_config": {"mask_token_id": mask}, "num_target_layers": n, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size, "num_hidden_layers": 5,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope.theta, "max_position_embeddings": cfg.max_position_embeddings})
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(DEVICE):
            target, drafter = Transformer(cfg).eval(), DFlashDrafter(dcfg).eval()
    finally:
        torch.set_default_dtype(default)
    return target.to(DEVICE), drafter.to(DEVICE)  # the rotary buffers are made on the CPU


def weight_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def filled_speculator(target, drafter, spec: SpecConfig, batch: int, context: int, attention: str,
                      time_stages: bool = False) -> Speculator:
    """`batch` slots each holding the same `context` committed rows (prefilled once, copied)."""
    sp = Speculator(target, drafter if spec.method != "none" else None, spec, slots=batch,
                    capacity=2 * context, time_stages=time_stages, attention=attention)
    prompt = torch.randint(0, target.config.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    sp.prefill(0, prompt)
    for cache in [sp.cache] + ([sp.draft_cache] if sp.draft_cache is not None else []):
        for t in cache.keys + cache.values:
            t[1:] = t[:1]
    sp.state.seq_lens.fill_(context)
    sp.state.active.fill_(True)
    sp.state.bonus.fill_(7)
    return sp


def attempt(row: dict, what: str, fn, *args) -> None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - keep the rest of the row and the other rows
        row[f"{what}_error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        torch.cuda.empty_cache() if DEVICE == "cuda" else None


def time_round_pair(target, drafter, spec, batch, context, attention, row, with_eager: bool) -> None:
    """Graphed round time with this attention backend (and, once per row, the eager time and a check
    that one replay emits the eager round's tokens from the same state)."""
    sp = filled_speculator(target, drafter, spec, batch, context, attention)
    graphed = GraphRunner(sp, log=None)
    if with_eager:
        row["eager_ms"] = 1e3 * GraphRunner(sp, enabled=False).time_round(batch, repeats=3)
        saved = sp.state.seq_lens.clone(), sp.state.bonus.clone()
        eager_tokens = sp.round(batch).walk.emitted.clone()
        sp.state.seq_lens.copy_(saved[0]), sp.state.bonus.copy_(saved[1])
        row["graphed_tokens_equal_eager"] = bool(torch.equal(graphed.round(batch).walk.emitted, eager_tokens))
        sp.state.seq_lens.copy_(saved[0]), sp.state.bonus.copy_(saved[1])
    row[f"graphed_{attention}_ms"] = 1e3 * graphed.time_round(batch, repeats=10)


def time_stages(target, drafter, spec, batch, context, attention, row) -> None:
    """Milliseconds per stage of graphed rounds (one graph per stage, CUDA events between them)."""
    sp = filled_speculator(target, drafter, spec, batch, context, attention, time_stages=True)
    staged = GraphRunner(sp, time_stages=True, log=None)
    saved = sp.state.seq_lens.clone(), sp.state.bonus.clone()
    totals: dict[str, float] = {}
    for i in range(6):
        result = staged.round(batch)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        if i:  # the first one captures
            for k, v in result.stage_seconds.items():
                totals[k] = totals.get(k, 0.0) + 1e3 * v / 5
        sp.state.seq_lens.copy_(saved[0]), sp.state.bonus.copy_(saved[1])
    row["stage_ms"] = totals
    row["tree_derive_walk_commit_share"] = (
        sum(v for k, v in totals.items() if k in ("tree", "derive_walk", "commit")) / sum(totals.values()))


def time_shape(name: str, context: int, batches: tuple[int, ...], deadline: float, log) -> dict:
    target, drafter = build_shape(name)
    target_bytes, drafter_bytes = weight_bytes(target), weight_bytes(drafter)
    out = {"target_GB": target_bytes / 1e9, "drafter_GB": drafter_bytes / 1e9,
           "floor_ms": 1e3 * target_bytes / COPY_BANDWIDTH,
           "floor_with_drafter_ms": 1e3 * (target_bytes + drafter_bytes) / COPY_BANDWIDTH, "rows": []}
    methods = [("none", 64), ("dflash", 64), ("ddtree", 64), ("ddtree", 256)]
    attentions = ("flex", "sdpa") if DEVICE == "cuda" else ("sdpa",)
    for batch in batches:
        for method, budget in methods:
            if time.monotonic() > deadline:
                out["rows"].append({"batch": batch, "method": method, "skipped": "deadline"})
                continue
            label = f"ddtree:{budget}" if method == "ddtree" else method
            row = {"batch": batch, "method": label}
            spec = SpecConfig(method, budget)
            for attention in attentions:
                attempt(row, attention, time_round_pair, target, drafter, spec, batch, context, attention, row,
                        attention == attentions[0])
            if method == "ddtree" and (batch == 1 or budget == 64):
                attempt(row, "stages", time_stages, target, drafter, spec, batch, context, attentions[0], row)
            out["rows"].append(row)
            log(f"  {name} {json.dumps(row)}")
    del target, drafter
    torch.cuda.empty_cache() if DEVICE == "cuda" else None
    return out


def check_smollm2(gguf: Path) -> dict:
    from transformers import AutoModelForCausalLM

    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
    llm = LLM(gguf, device=DEVICE, dtype="float32")
    outs = llm.generate(prompts, greedy(32))
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).to(DEVICE).eval()
    same = []
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids], device=DEVICE)
        r = ref.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0,
                         attention_mask=torch.ones_like(ids))
        same.append(out.token_ids == r[0, ids.shape[1]:].tolist())
    bf16 = LLM(gguf, device=DEVICE, dtype="bfloat16")
    start = time.perf_counter()
    reply = bf16.chat([{"role": "user", "content": "Write a haiku about trees"}], SamplingParams(temperature=0, max_tokens=64))[0]
    seconds = time.perf_counter() - start
    return {"smollm2 float32 greedy == transformers (3 prompts)": all(same),
            "smollm2 bf16 chat reply": reply.text[:120],
            "smollm2 bf16 eager tokens/s (informational, batch 1, no CUDA graphs)": round(len(reply.token_ids) / seconds, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", type=Path, default=None, help="path of the SmolLM2 GGUF on the GPU machine")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--target", default="qwen3", choices=("llama", "qwen2", "qwen3", "mistral", "gpt_oss", "smollm3",
                                                                   "phi3", "gemma3"),
                    help="the tiny target of B, C, E and F (default qwen3; mistral, gpt_oss, smollm3, phi3 and "
                         "gemma3 have sliding windows, which the flex and hybrid attentions refuse: pass "
                         "--attentions sdpa,splitkv)")
    ap.add_argument("--sections", default="ABCEFLPRS", help="which of A B C E F L P R S T to run (default all but T)")
    ap.add_argument("--parity-targets", default="", help="comma-separated tiny targets section A checks (default all)")
    ap.add_argument("--attentions", default="flex,sdpa,splitkv,hybrid",
                    help="attention backends section E checks (C and F: the first)")
    ap.add_argument("--timings", default="", help="comma-separated shapes for G: smollm2-135m,qwen3-8b")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--logprobs-timings", default="", help="comma-separated shapes for L's graphed round times")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--budget-s", type=float, default=1e9, help="skip G rows that would start after this many seconds")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    cuda = DEVICE == "cuda"
    assert not cuda or torch.cuda.is_available(), "needs a CUDA device"
    deadline = time.monotonic() + args.budget_s
    results = {"device": torch.cuda.get_device_name() if cuda else DEVICE, "torch": torch.__version__,
               "command": " ".join(sys.argv), "source_digest": source_digest()}  # scripts/which_commit.py

    def save(section: str, value) -> None:
        results[section] = value
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
        print(json.dumps({section: value}, indent=2), flush=True)

    def run(section: str, fn, *a) -> None:
        start = time.monotonic()
        try:
            value = fn(*a)
        except Exception as e:  # noqa: BLE001 - report and go on with the other sections
            traceback.print_exc()
            value = {"error": f"{type(e).__name__}: {e}"}
        if isinstance(value, dict):
            value["seconds"] = round(time.monotonic() - start, 1)
        save(section, value)

    with tempfile.TemporaryDirectory() as tmp:
        targets = tiny_targets(Path(tmp)) if set(args.sections) & set("ABCEFLPRS") else {}
        drafter = tiny_drafter(Path(tmp)) if targets else None
        if "T" in args.sections and cuda:
            run("T. tree kernel == build_tree", check_tree_kernel)
        if "E" in args.sections:
            run("E. CUDA graphs == eager", check_graphs_equal_eager, targets[args.target], drafter,
                tuple(args.attentions.split(",")))
        if "L" in args.sections:
            run("L. log-probs and penalties", check_logprobs, targets["qwen3"], drafter, None,
                [s for s in args.logprobs_timings.split(",") if s] if cuda else [])
        if "S" in args.sections:
            run("S. structured outputs", check_structured, targets["qwen3"], drafter)
        if "P" in args.sections:
            run("P. graphs sharing one memory pool", check_shared_pool, targets["qwen3"], drafter)
        if "R" in args.sections:
            run("R. prefix reuse", check_prefix_reuse, targets["qwen3"], drafter)
        if "F" in args.sections and cuda:
            run("F. host synchronisation in replayed rounds", check_no_sync_in_replay, targets[args.target], drafter,
                args.attentions.split(",")[0])
        batches = tuple(int(b) for b in args.batches.split(","))
        for name in filter(None, args.timings.split(",")):
            run(f"G. timings {name}", time_shape, name, args.context, batches, deadline, print)
        if "A" in args.sections:
            chosen = args.parity_targets.split(",") if args.parity_targets else list(targets)
            run("A. parity with transformers (fp32)", check_parity, {name: targets[name] for name in chosen})
        if "B" in args.sections:
            run("B. speculative greedy and seeded sampling", check_speculative, targets[args.target], drafter)
        if "C" in args.sections and cuda:
            run("C. host synchronisation in eager rounds", check_no_sync, targets[args.target], drafter,
                args.attentions.split(",")[0])
    if args.smollm2:
        run("D. SmolLM2-135M-Instruct", check_smollm2, args.smollm2)
    failed = [k for section in results.values() if isinstance(section, dict) for k, v in section.items()
              if v is False or k == "error" or (isinstance(v, str) and v.startswith("sync inside"))]
    failed += [f"{name} batch {row['batch']} {row['method']}" for name, section in results.items()
               if isinstance(section, dict) for row in section.get("rows", [])
               if any(k.endswith("error") for k in row) or row.get("graphed_tokens_equal_eager") is False]
    print("FAILED: " + ", ".join(failed) if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

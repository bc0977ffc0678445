"""The splitkv attention kernels (treeflash/splitkv_attention.py), run by Triton's interpreter on CPU
tensors: the same visibility as the dense-mask reference, and whole rounds that decode exactly as
plain decoding does. float32 only (the interpreter's bfloat16 dot is not exact); on a GPU
scripts/gpu_check.py checks the same in float32 and the H200 runs use bfloat16 (benchmarks/h200-splitkv).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from triton_interpreter import mend  # noqa: F401  (first: it turns the interpreter on)
from treeflash.attention import SplitKVMask, attend, attend_new, check_backend, round_layout
from treeflash.kv_cache import KVCache, append_layout
from treeflash.llm import LLM
from treeflash.sampling import SamplingParams
from spec_helpers import hf_greedy, load_hf, make_drafter, make_target


pytestmark = pytest.mark.usefixtures("mend")


def random_tree_mask(batch: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """[B, T, T] ancestor-or-self masks of random trees (parents precede children)."""
    mask = torch.eye(t, dtype=torch.bool).repeat(batch, 1, 1)
    for b in range(batch):
        for i in range(1, t):
            mask[b, i] |= mask[b, int(torch.randint(0, i, (1,), generator=gen))]
    return mask


CASES = [  # batch, heads, kv_heads, new tokens, head_dim, capacity, committed rows, programs wanted
    (1, 9, 3, 1, 64, 256, [100], None),  # a decode step, SmolLM2's 3 query heads per KV head
    (1, 9, 3, 5, 64, 256, [100], 64),  # many splits, most of them past the context
    (2, 9, 3, 17, 64, 512, [0, 300], 64),  # an empty prefix beside a long one
    (2, 4, 2, 33, 32, 512, [1, 450], None),
    (2, 4, 1, 65, 16, 256, [64, 128], 1),  # one split: the partial kernel writes the output itself
    (3, 8, 8, 9, 16, 128, [0, 63, 64], 16),  # no grouping; contexts at a block's edges
    (1, 4, 1, 3, 128, 8192, [5000], 4096),  # splits capped at MAX_SPLITS; a one-row merge tile
    (1, 4, 1, 65, 16, 256, [100], 64),  # a split that starts among the new rows (no committed rows of its own)
]


@pytest.mark.parametrize("batch,heads,kv_heads,t,head_dim,capacity,seqs,programs", CASES)
def test_splitkv_matches_the_dense_mask(monkeypatch, batch, heads, kv_heads, t, head_dim, capacity, seqs, programs):
    import treeflash.splitkv_attention as kernels

    if programs is not None:
        monkeypatch.setattr(kernels, "_programs_wanted", lambda device, per_sm: programs)
    gen = torch.Generator().manual_seed(t)
    q = torch.randn(batch, heads, t, head_dim, generator=gen)
    k = torch.randn(batch, kv_heads, capacity, head_dim, generator=gen)
    v = torch.randn(batch, kv_heads, capacity, head_dim, generator=gen)
    seq_lens = torch.tensor(seqs)
    new_mask = random_tree_mask(batch, t, gen)
    _, dense = append_layout(seq_lens, new_mask, capacity)
    rows, mask = round_layout(seq_lens, new_mask, capacity, "splitkv")
    assert isinstance(mask, SplitKVMask) and mask.shape == (batch, t, capacity)
    assert torch.equal(rows, seq_lens[:, None] + torch.arange(t))
    out = attend(q, k, v, mask)
    torch.testing.assert_close(out, attend(q, k, v, dense), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch,heads,kv_heads,t,head_dim,capacity,seqs,programs", CASES[:5])
def test_splitkv_stores_the_new_rows_as_it_attends(monkeypatch, batch, heads, kv_heads, t, head_dim, capacity, seqs,
                                                   programs):
    import treeflash.splitkv_attention as kernels

    if programs is not None:
        monkeypatch.setattr(kernels, "_programs_wanted", lambda device, per_sm: programs)
    gen = torch.Generator().manual_seed(t + 1)
    cache = KVCache.allocate(2, batch, kv_heads, capacity, head_dim, torch.float32, "cpu")
    for tensor in cache.stacked:
        tensor.copy_(torch.randn(tensor.shape, generator=gen))
    expected = KVCache._of(*(tensor.clone() for tensor in cache.stacked))
    q = torch.randn(batch, heads, t, head_dim, generator=gen)
    k = torch.randn(batch, kv_heads, t, head_dim, generator=gen)
    v = torch.randn(batch, t, kv_heads, head_dim, generator=gen).transpose(1, 2)  # strided, as the model's
    seq_lens = torch.tensor(seqs)
    new_mask = random_tree_mask(batch, t, gen)
    rows, dense = append_layout(seq_lens, new_mask, capacity)
    want = attend(q, *expected.extend(1, k, v, rows, capacity), dense)
    _, mask = round_layout(seq_lens, new_mask, capacity, "splitkv")
    got = attend_new(q, k, v, cache, 1, rows, mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(cache.stacked, expected.stacked):
        assert torch.equal(mine, theirs)  # the new rows stored, nothing else touched (layer 0 neither)


@pytest.mark.parametrize("launch", [dict(max_block_m=16, block_n=32),
                                    dict(max_block_m=128, block_n=128, programs_per_sm=16)])
def test_splitkv_launch_settings_keep_the_result(launch):
    """Other row blocks, KV steps and grids (benchmarks/splitkv_ab.py times them) attend and store the same."""
    from treeflash.splitkv_attention import Launch, splitkv_attention

    gen = torch.Generator().manual_seed(7)
    batch, heads, kv_heads, t, head_dim, capacity = 2, 8, 2, 33, 32, 512
    q = torch.randn(batch, heads, t, head_dim, generator=gen)
    cache_k, cache_v = (torch.randn(batch, kv_heads, capacity, head_dim, generator=gen) for _ in range(2))
    new_k, new_v = (torch.randn(batch, kv_heads, t, head_dim, generator=gen) for _ in range(2))
    seq_lens = torch.tensor([5, 300])
    new_mask = random_tree_mask(batch, t, gen)
    got_k, got_v = cache_k.clone(), cache_v.clone()
    got = splitkv_attention(q, got_k, got_v, seq_lens.int(), new_mask.to(torch.uint8), new_k, new_v, Launch(**launch))
    rows, dense = append_layout(seq_lens, new_mask, capacity)
    for cache, new in ((cache_k, new_k), (cache_v, new_v)):
        for b in range(batch):
            cache[b, :, rows[b]] = new[b]
    torch.testing.assert_close(got, attend(q, cache_k, cache_v, dense), rtol=1e-5, atol=1e-5)
    assert torch.equal(got_k, cache_k) and torch.equal(got_v, cache_v)


def test_the_launch_benchmark_checks_every_launch():
    """benchmarks/splitkv_ab.py's correctness half (its timing and FlexAttention need CUDA)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import splitkv_ab

    from treeflash.splitkv_attention import DEFAULT_LAUNCH, Launch

    launches = [Launch(*x) for x in splitkv_ab.LAUNCHES]
    assert launches[0] == DEFAULT_LAUNCH and len(set(launches)) == len(launches)
    baseline = splitkv_ab.load_module(str(Path(__file__).resolve().parents[1] / "treeflash" / "splitkv_attention.py"),
                                      "baseline_splitkv_attention")
    row = splitkv_ab.point(4, 2, 16, 2, 5, 40, launches[:2] + [Launch(16, 32)], torch.device("cpu"),
                           baseline=baseline, **splitkv_ab.DRY_RUN)
    assert [r["max_block_m"] for r in row["launches"]] == [64, 64, 16]
    assert max(r["max_abs_err"] for r in row["launches"]) < 1e-5 and row["baseline_max_abs_err"] < 1e-5


def test_splitkv_refuses_a_head_dimension_it_cannot_tile():
    with pytest.raises(ValueError, match="power-of-two head dimension of at least 16; this model's is 80"):
        check_backend("splitkv", "cpu", head_dim=80)
    assert check_backend("splitkv", "cpu", head_dim=64) == "splitkv"


def test_splitkv_needs_cuda_outside_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        check_backend("splitkv", "cpu")


# hybrid: every call here (9-node trees, 4-token blocks, 2 query heads per KV head) picks splitkv; the
# flex half of a hybrid round needs CUDA.
@pytest.mark.parametrize("spec,budget,attention", [("ddtree", 8, "splitkv"), ("dflash", 64, "splitkv"),
                                                   ("ddtree", 8, "hybrid")])
def test_splitkv_rounds_decode_as_plain_decoding(tmp_path, spec, budget, attention):
    target = make_target(tmp_path / "target", vocab=64, hidden=64, heads=4, kv_heads=2, layers=2)
    drafter = make_drafter(tmp_path / "drafter", target, block_size=4)
    prompts = [[5, 17, 42, 8, 99 % 64, 3], [1, 2, 3]]
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * 2
    plain = LLM(str(target), device="cpu", dtype="float32", spec="none", max_num_seqs=2)
    expected = [o.token_ids for o in plain.generate(prompt_token_ids=prompts, sampling_params=params)]
    llm = LLM(str(target), device="cpu", dtype="float32", draft_model=str(drafter), spec=spec, tree_budget=budget,
              max_num_seqs=2, attention=attention)
    assert llm.engine.speculator.attention == attention
    assert [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)] == expected


@pytest.mark.parametrize("arch", ["gpt_oss", "mistral"])
def test_windowed_and_sink_rounds_decode_as_transformers(tmp_path, arch):
    """GPT-OSS (windows of 6 on layer 0, sinks) and Mistral (windows of 6 everywhere): prompts and tokens past the
    window, through the kernels' windowed walk and sinks, prefill and DDTree rounds, give transformers' tokens."""
    target = make_target(tmp_path / "target", arch=arch, vocab=64, hidden=64, heads=4, kv_heads=2, layers=2,
                         init_std=0.1, window=6)
    drafter = make_drafter(tmp_path / "drafter", target, block_size=4)
    prompts = [[5, 17, 42, 8, 30, 3, 9, 11, 60, 2], [1, 2, 3]]
    params = [SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)] * 2
    hf = load_hf(target)
    expected = [hf_greedy(hf, p, 14) for p in prompts]
    for spec in ("none", "ddtree"):
        llm = LLM(str(target), device="cpu", dtype="float32", draft_model=None if spec == "none" else str(drafter),
                  spec=spec, tree_budget=8, max_num_seqs=2, attention="splitkv")
        assert [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)] == expected


@pytest.mark.parametrize("batch,kv_heads,t,head_dim", [(1, 8, 1, 128), (2, 3, 17, 64), (3, 2, 40, 16)])
def test_the_store_kernel_writes_what_two_scatters_write(batch, kv_heads, t, head_dim):
    # treeflash/kv_store.py, KVCache.write's one launch on CUDA for FlexAttention's and SDPA's paths.
    from treeflash.kv_store import fits, store_rows

    gen = torch.Generator().manual_seed(t)
    capacity = 64
    keys, values = (torch.randn(batch, kv_heads, capacity, head_dim, generator=gen) for _ in range(2))
    k = torch.randn(batch, kv_heads, t, head_dim, generator=gen)
    v = torch.randn(batch, t, kv_heads, head_dim, generator=gen).transpose(1, 2)  # strided, as the model's
    rows = torch.stack([torch.randperm(capacity, generator=gen)[:t] for _ in range(batch)])
    want_k, want_v = keys.clone(), values.clone()
    index = rows[:, None, :, None].expand_as(k)
    want_k.scatter_(2, index, k)
    want_v.scatter_(2, index, v)
    assert fits(k, v, keys, values)
    store_rows(keys, values, k, v, rows)
    assert torch.equal(keys, want_k) and torch.equal(values, want_v)
    assert not fits(torch.zeros(1, 1, 1, 80), v, keys, values)  # head dims other than powers of two: scatter


def test_launch_for_follows_the_measured_rule():
    from treeflash.splitkv_attention import (DEFAULT_LAUNCH, FEW_ROWS_WIDE_HEADS, MANY_ROWS_WIDE_HEADS,
                                             MOST_ROWS_WIDE_HEADS, Launch, launch_for)

    assert launch_for(64, 1) == launch_for(64, 4 * 257) == DEFAULT_LAUNCH  # SmolLM2's heads: the default
    assert launch_for(128, 4) == launch_for(128, 64) == FEW_ROWS_WIDE_HEADS  # Qwen3-8B: AR step, draft block
    assert launch_for(128, 4 * 65) == MANY_ROWS_WIDE_HEADS  # a 65-node tree
    assert launch_for(128, 4 * 257) == MOST_ROWS_WIDE_HEADS  # a 257-node tree
    assert launch_for(128, 4 * 17, batch=4) == MANY_ROWS_WIDE_HEADS  # 272 rows over the batch: still a tree's
    assert launch_for(128, 4 * 17, batch=8) == FEW_ROWS_WIDE_HEADS  # 544: programs enough without
    # float32: the same launch with KV steps half as wide (the same tile bytes)
    assert launch_for(128, 4 * 65, 4) == Launch(64, 64, 4, 2, 1) and launch_for(64, 1, 4).block_n == 32
    # heads of 256 (Gemma 3): the same, KV steps half as wide again (float32 a quarter)
    assert launch_for(256, 4 * 65) == Launch(64, 64, 4, 2, 1) and launch_for(256, 4 * 65, 4).block_n == 32
    assert launch_for(256, 4).block_n == 16


def test_a_prefill_of_pieces_in_any_slots_attends_and_stores_as_sdpa_does(tmp_path):
    """Prefill through the splitkv kernels (each piece's slot passed to them, every padded token stored as a
    prefill graph stores it) gives the hidden states and cache rows of the dense-mask path."""
    from treeflash.checkpoint import load_drafter, load_target
    from treeflash.round import PrefillPiece, SpecConfig, Speculator

    target_dir = make_target(tmp_path / "target", vocab=64, hidden=64, heads=4, kv_heads=2, layers=2)
    target = load_target(target_dir, "cpu", torch.float32)[0]
    drafter = load_drafter(make_drafter(tmp_path / "drafter", target_dir, block_size=4), "cpu", torch.float32)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 62, (n,), generator=gen).tolist() for n in (7, 30, 19)]

    def prefilled(attention):
        sp = Speculator(target, drafter, SpecConfig("ddtree", 8), slots=5, capacity=64, time_stages=False,
                        attention=attention)
        sp.prefill_many([PrefillPiece(1, prompts[1], 0, 16)])  # a later chunk starts at row 16
        # Three pieces padded to 16 tokens and 4 pieces (the fourth repeats the first), slots out of order.
        pieces = [PrefillPiece(3, prompts[0], 0, 7), PrefillPiece(1, prompts[1], 16, 30),
                  PrefillPiece(0, prompts[2], 0, 16)]
        last = sp.prefill_forward(sp.prefill_batch(pieces, 4, 16), 32)
        return sp, last[:3]

    dense, want = prefilled("sdpa")
    mine, got = prefilled("splitkv")
    assert isinstance(mine.attention, str) and mine.attention == "splitkv"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for slot, end in ((3, 7), (1, 30), (0, 16)):
        for caches in ((mine.cache, dense.cache), (mine.draft_cache, dense.draft_cache)):
            for a, b in zip(caches[0].stacked, caches[1].stacked):
                torch.testing.assert_close(a[:, slot, :, :end], b[:, slot, :, :end], rtol=1e-5, atol=1e-5)
    untouched = (2, 4)
    assert all(not t[:, list(untouched)].any() for t in mine.cache.stacked)


def windowed_sink_reference(q, k, v, seq_lens, new_mask, first=None, sinks=None):
    """float32 attention of the new tokens (rows seq_lens + t of k, v, every batch row its own slot) by a
    dense [T, L] mask: committed rows from each token's first on, new rows by new_mask; sinks as GPT-OSS's
    eager attention has them, a logit column appended to the scores and dropped after the softmax. A token
    that sees nothing gets zeros."""
    batch, heads, t, head_dim = q.shape
    groups = heads // k.shape[1]
    out = torch.zeros(batch, t, heads, head_dim)
    for b in range(batch):
        seq = int(seq_lens[b])
        lo = torch.zeros(t, dtype=torch.long) if first is None else first[b].long()
        visible = torch.cat([torch.arange(seq)[None, :] >= lo[:, None], new_mask[b].bool()], 1)  # [T, seq + T]
        keys, values = (x[b, :, :seq + t].float().repeat_interleave(groups, 0) for x in (k, v))
        scores = (q[b].float() @ keys.transpose(1, 2) * head_dim ** -0.5).masked_fill(~visible, float("-inf"))
        if sinks is not None:
            scores = torch.cat([scores, sinks.float()[:, None, None].expand(heads, t, 1)], -1)
        probs = scores.softmax(-1)[..., :seq + t].nan_to_num(0.0)
        out[b] = (probs @ values).transpose(0, 1)
    return out.flatten(2)


def window_firsts(seqs: list[int], t: int, gen: torch.Generator) -> torch.Tensor:
    """[B, T] int32 first committed rows: row 0 random, one from 0; row 1 a 40-row sliding window (a walk
    that starts near the context's end); row 2 random, one with no committed row at all."""
    first = torch.stack([torch.randint(0, s + 1, (t,), generator=gen) for s in seqs])
    first[0, 0] = 0
    first[1] = (seqs[1] + torch.arange(t) + 1 - 40).clamp_min(0)
    first[2, -1] = seqs[2]
    return first.int()


def force_splits(monkeypatch, splits: int, batch: int, kv_heads: int, rows: int, capacity: int, launch) -> None:
    """Makes `num_splits` cut this call `splits` ways (the grid it aims at)."""
    import treeflash.splitkv_attention as kernels

    programs = batch * kv_heads * -(-rows // min(launch.max_block_m, max(16, 1 << (rows - 1).bit_length())))
    monkeypatch.setattr(kernels, "_programs_wanted", lambda device, per_sm: programs * splits)
    assert kernels.num_splits(programs, capacity, torch.device("cpu"), launch) == splits


@pytest.mark.parametrize("t", [1, 6])
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("window,sink", [(True, False), (False, True), (True, True)])
def test_splitkv_windows_and_sinks_match_a_dense_softmax(monkeypatch, t, splits, window, sink):
    """Sliding windows (each token's first committed row) and attention sinks, 8 query heads over 2 KV heads,
    a decode step and a tree, normalised in the partial kernel (1 split) or the merge."""
    from treeflash.splitkv_attention import Launch, splitkv_attention

    launch = Launch(max_block_m=16, block_n=16)
    batch, heads, kv_heads, head_dim, capacity, seqs = 3, 8, 2, 16, 256, [45, 230, 100]
    force_splits(monkeypatch, splits, batch, kv_heads, heads // kv_heads * t, capacity, launch)
    gen = torch.Generator().manual_seed(10 * t + splits)
    q = torch.randn(batch, heads, t, head_dim, generator=gen)
    k, v = (torch.randn(batch, kv_heads, capacity, head_dim, generator=gen) for _ in range(2))
    seq_lens = torch.tensor(seqs, dtype=torch.int32)
    new_mask = random_tree_mask(batch, t, gen)
    first = window_firsts(seqs, t, gen) if window else None
    sinks = torch.randn(heads, generator=gen) * 2 if sink else None
    want = windowed_sink_reference(q, k, v, seq_lens, new_mask, first, sinks)
    if window:  # the sliding row's walk starts at its window's KV step: rows below it are never read
        k[1, :, :int(first[1].min()) // 16 * 16] = float("nan")
        v[1, :, :int(first[1].min()) // 16 * 16] = float("nan")
    got = splitkv_attention(q, k, v, seq_lens, new_mask.to(torch.uint8), launch=launch, first=first, sinks=sinks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_window_sizes_the_splits_and_changes_no_value(monkeypatch):
    """`window` sizes the KV splits to the window's rows, not the cache's capacity (at most one split per
    block_n rows: a 32-row window over a 256-row cache gets 2, not 16), and the output is the same."""
    import treeflash.splitkv_attention as kernels

    launch = kernels.Launch(max_block_m=16, block_n=16)
    batch, heads, kv_heads, head_dim, capacity, t = 2, 4, 2, 16, 256, 3
    monkeypatch.setattr(kernels, "_programs_wanted", lambda device, per_sm: 1 << 12)
    reaches = []
    sized = kernels.num_splits
    monkeypatch.setattr(kernels, "num_splits", lambda p, reach, *a: reaches.append(reach) or sized(p, reach, *a))
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(batch, heads, t, head_dim, generator=gen)
    k, v = (torch.randn(batch, kv_heads, capacity, head_dim, generator=gen) for _ in range(2))
    seq_lens = torch.tensor([200, 31], dtype=torch.int32)
    positions = seq_lens[:, None] + torch.arange(t)
    first = (positions - 31).clamp_min(0).to(torch.int32)
    new_mask = torch.ones(t, t).tril().expand(batch, t, t).to(torch.uint8)
    calls = [kernels.splitkv_attention(q, k, v, seq_lens, new_mask, launch=launch, first=first, window=w)
             for w in (None, 32)]
    assert reaches == [capacity, 32]
    assert [sized(1, r, q.device, launch) for r in reaches] == [16, 2]
    torch.testing.assert_close(calls[1], calls[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("splits", [1, 4])
def test_splitkv_windows_and_sinks_store_the_new_rows_in_any_slots(monkeypatch, splits):
    """The prefill path: new rows stored by the kernel into the batch rows' slots as it attends."""
    from treeflash.splitkv_attention import Launch, splitkv_attention

    launch = Launch(max_block_m=16, block_n=16)
    batch, heads, kv_heads, t, head_dim, capacity, seqs = 3, 8, 2, 5, 16, 256, [45, 230, 100]
    force_splits(monkeypatch, splits, batch, kv_heads, heads // kv_heads * t, capacity, launch)
    gen = torch.Generator().manual_seed(splits)
    slots = torch.tensor([3, 0, 2])
    q = torch.randn(batch, heads, t, head_dim, generator=gen)
    cache_k, cache_v = (torch.randn(4, kv_heads, capacity, head_dim, generator=gen) for _ in range(2))
    new_k = torch.randn(batch, kv_heads, t, head_dim, generator=gen)
    new_v = torch.randn(batch, t, kv_heads, head_dim, generator=gen).transpose(1, 2)  # strided
    seq_lens = torch.tensor(seqs, dtype=torch.int32)
    new_mask = random_tree_mask(batch, t, gen)
    first = window_firsts(seqs, t, gen)
    sinks = torch.randn(heads, generator=gen) * 2
    want_k, want_v = cache_k.clone(), cache_v.clone()
    for b, slot in enumerate(slots.tolist()):
        want_k[slot, :, seqs[b]:seqs[b] + t] = new_k[b]
        want_v[slot, :, seqs[b]:seqs[b] + t] = new_v[b]
    got = splitkv_attention(q, cache_k, cache_v, seq_lens, new_mask.to(torch.uint8), new_k, new_v, launch, slots,
                            first, sinks)
    want = windowed_sink_reference(q, want_k[slots], want_v[slots], seq_lens, new_mask, first, sinks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(cache_k, want_k) and torch.equal(cache_v, want_v)


@pytest.mark.parametrize("splits", [1, 4])
def test_a_token_that_sees_nothing_gets_zeros_with_or_without_a_sink(monkeypatch, splits):
    """A token with no committed row in its window and no new row in its mask: 0, not NaN (a sink adds to
    the denominator only), beside tokens of the same row block that see rows."""
    from treeflash.splitkv_attention import Launch, splitkv_attention

    launch = Launch(max_block_m=16, block_n=16)
    batch, heads, kv_heads, t, head_dim, capacity, seqs = 1, 4, 1, 3, 16, 128, [70]
    force_splits(monkeypatch, splits, batch, kv_heads, heads // kv_heads * t, capacity, launch)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(batch, heads, t, head_dim, generator=gen)
    k, v = (torch.randn(batch, kv_heads, capacity, head_dim, generator=gen) for _ in range(2))
    seq_lens = torch.tensor(seqs, dtype=torch.int32)
    new_mask = random_tree_mask(batch, t, gen)
    new_mask[0, 1] = False
    first = torch.tensor([[3, 70, 50]], dtype=torch.int32)
    for sinks in (None, torch.randn(heads, generator=gen)):
        got = splitkv_attention(q, k, v, seq_lens, new_mask.to(torch.uint8), launch=launch, first=first,
                                sinks=sinks).view(batch, t, heads, head_dim)
        assert not got.isnan().any() and not got[:, 1].any()
        torch.testing.assert_close(got.flatten(2), windowed_sink_reference(q, k, v, seq_lens, new_mask, first, sinks),
                                   rtol=1e-5, atol=1e-5)

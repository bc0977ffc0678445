"""The GPU fast path's model-side pieces (treeflash/models/kernels.py) checked on the CPU: fused q/k/v and
gate/up projections keep HF's parameters and the model's outputs, speculative decoding stays greedy-identical
through them, and the FlexAttention kernel choice is what `flex_decode_tokens` says. The compiled pieces
need CUDA: their check against the eager ones runs only where a GPU is."""

from __future__ import annotations

import os

import pytest
import torch

from treeflash import LLM, SamplingParams
from treeflash.attention import FLEX_DECODE_TOKENS, FlexMask, round_layout
from treeflash.checkpoint import load_drafter, load_target
from treeflash.kv_cache import PrefixKV
from treeflash.models.dflash import save_drafter
from treeflash.models.kernels import COMPILED, EAGER, use_fast_path
from spec_helpers import make_drafter, make_target


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("kernels")
    target = make_target(root / "target", vocab=64, layers=2)
    return target, make_drafter(root / "drafter", target, 8)


@torch.inference_mode()  # the fused projections serve inference (autograd takes the separate ones)
def forward(model, tokens):
    t = tokens.shape[1]
    causal = torch.ones(1, t, t, dtype=torch.bool).tril()
    positions = torch.arange(t)[None]
    hidden, captured = model(tokens, positions, PrefixKV(), None, causal, (0, 1))
    return model.logits(hidden), captured


def test_fused_projections_keep_parameters_and_outputs(pair):
    target_dir, drafter_dir = pair
    model, _ = load_target(target_dir, "cpu", torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    tokens = torch.tensor([[3, 5, 7, 11, 2, 9]])
    logits, captured = forward(model, tokens)
    use_fast_path(model, fused=True)
    use_fast_path(model, fused=True)  # idempotent
    after = dict(model.named_parameters())
    assert list(after) == list(before)  # HF's names, in order; nothing added
    assert all(torch.equal(after[n], before[n]) for n in before)
    attn = model.layers[0].self_attn
    assert attn.use_fused and attn.q_proj.weight.data_ptr() == attn.qkv[0].data_ptr()  # views: no copy
    fused_logits, fused_captured = forward(model, tokens)
    torch.testing.assert_close(fused_logits, logits, rtol=1e-5, atol=1e-5)
    for a, b in zip(fused_captured, captured):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    use_fast_path(model, fused=False)  # back to separate projections: the very same numbers as before
    assert torch.equal(forward(model, tokens)[0], logits)

    drafter = load_drafter(drafter_dir, "cpu", torch.float32)
    names = [n for n, _ in drafter.named_parameters()]
    use_fast_path(drafter, fused=True)
    assert [n for n, _ in drafter.named_parameters()] == names
    features = torch.randn(1, 4, drafter.fc.in_features)
    positions = torch.arange(4)[None]
    with torch.inference_mode():
        fused_kv = drafter.context_kv(features, positions)  # k and v through one GEMM over the fused rows
        use_fast_path(drafter, fused=False)
        plain_kv = drafter.context_kv(features, positions)
    for (k1, v1), (k2, v2) in zip(fused_kv, plain_kv):
        torch.testing.assert_close(k1, k2, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v1, v2, rtol=1e-5, atol=1e-6)


def test_a_fused_drafter_saves_the_checkpoint_it_was_loaded_from(pair, tmp_path):
    _, drafter_dir = pair
    drafter = load_drafter(drafter_dir, "cpu", torch.float32)
    use_fast_path(drafter, fused=True)
    again = load_drafter(save_drafter(drafter, tmp_path / "again"), "cpu", torch.float32)
    original = dict(load_drafter(drafter_dir, "cpu", torch.float32).named_parameters())
    assert all(torch.equal(p, original[n]) for n, p in again.named_parameters())


@pytest.mark.parametrize("spec,budget", [("ddtree", 8), ("dflash", 64)])
def test_speculation_through_fused_projections_is_greedy_identical(pair, spec, budget):
    target_dir, drafter_dir = pair
    prompts = [[3, 5, 7, 11], [2, 4, 6], [9, 8, 7, 6, 5]]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    plain = LLM(str(target_dir), device="cpu", spec="none", max_num_seqs=3)
    use_fast_path(plain.model, fused=True)
    llm = LLM(str(target_dir), device="cpu", draft_model=str(drafter_dir), spec=spec, tree_budget=budget,
              max_num_seqs=3)
    use_fast_path(llm.model, fused=True)
    use_fast_path(llm.drafter, fused=True)
    want = [o.token_ids for o in plain.generate(prompt_token_ids=prompts, sampling_params=greedy)]
    assert [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=greedy)] == want


@pytest.mark.parametrize("norm", [True, False])  # Qwen3's per-head norms, or rotary alone (Llama)
def test_q_and_k_from_the_fused_output_are_normed_and_rotated_as_apart(norm):
    # With fused projections q's and k's heads are adjacent in one GEMM's output (rotary alone: one piece).
    gen = torch.Generator().manual_seed(0)
    b, t, q_heads, k_heads, d = 2, 3, 4, 2, 8
    x = torch.randn(b, t, q_heads + k_heads, d, generator=gen)
    q_weight, k_weight = (torch.randn(d, generator=gen), torch.randn(d, generator=gen)) if norm else (None, None)
    cos, sin = torch.randn(b, t, d, generator=gen), torch.randn(b, t, d, generator=gen)
    q, k = EAGER.qk_norm_rotary(x, q_weight, k_weight, 1e-6, cos, sin, q_heads)
    assert torch.equal(q, EAGER.norm_rotary(x[:, :, :q_heads], q_weight, 1e-6, cos, sin))
    assert torch.equal(k, EAGER.norm_rotary(x[:, :, q_heads:], k_weight, 1e-6, cos, sin))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_residual_sum_in_the_next_norm_changes_no_value(tmp_path, dtype):
    # run_layers adds a layer's MLP output in the next norm's kernel; written out as the residual sum of
    # each layer, then the norm, eagerly the hidden states and the captured layers are the same bits.
    model = load_target(make_target(tmp_path / "t", vocab=100, hidden=64, layers=4), "cpu", dtype)[0]
    tokens, positions = torch.randint(0, 100, (2, 7)), torch.arange(7).expand(2, 7)
    causal = torch.ones(7, 7, dtype=torch.bool).tril().expand(2, 7, 7)
    mask = torch.cat([causal, torch.zeros(2, 7, 9, dtype=torch.bool)], -1)  # over the 16 cache rows
    x, cache, outputs = model.embed_tokens(tokens), model.new_cache(2, 16), []
    cos, sin = model.rotary(positions, x.dtype)
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn(layer.input_layernorm(x), cos, sin, cache, i, positions, mask)
        x = x + attn
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        outputs.append(x)
    hidden, captured = model(tokens, positions, model.new_cache(2, 16), positions, mask, capture_layers=(1, 3))
    assert torch.equal(hidden, model.norm(x))
    assert torch.equal(captured[0], outputs[1]) and torch.equal(captured[1], outputs[3])


def test_flex_kernel_choice_follows_flex_decode_tokens():
    pytest.importorskip("torch.nn.attention.flex_attention")
    seq = torch.tensor([130, 7])
    for t, limit, decode in [(1, FLEX_DECODE_TOKENS, True), (17, 1, False), (17, 32, True), (5, 4, False)]:
        new = torch.ones(2, t, t, dtype=torch.bool).tril()
        rows, mask = round_layout(seq, new, 512, "flex", flex_decode_tokens=limit)
        assert isinstance(mask, FlexMask) and mask.decode_kernel is decode
        assert mask.shape[-1] == 512 and torch.equal(rows[:, 0], seq)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled pieces need CUDA (Inductor/Triton)")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                    reason="Triton's interpreter is on in this process (tests/triton_interpreter.py, imported by "
                    "another test module): run tests/test_kernels.py alone on a GPU")
def test_compiled_pieces_match_eager_on_cuda():
    torch.manual_seed(0)
    dev = "cuda"
    for n in (1, 5, 37):  # N = 1 is specialised; later counts share one dynamic graph
        x, delta = torch.randn(2, n, 64, device=dev), torch.randn(2, n, 64, device=dev)
        w = torch.randn(64, device=dev)
        torch.testing.assert_close(COMPILED.rms_norm(x, w, 1e-6), EAGER.rms_norm(x, w, 1e-6))
        for a, b in zip(COMPILED.add_rms_norm(x, delta, w, 1e-6), EAGER.add_rms_norm(x, delta, w, 1e-6)):
            torch.testing.assert_close(a, b)
        gate, up = torch.randn(2, n, 128, device=dev).chunk(2, -1)
        torch.testing.assert_close(COMPILED.silu_mul(gate, up), EAGER.silu_mul(gate, up))
        positions = torch.arange(n, device=dev)[None].expand(2, n)
        inv_freq = 1.0 / (1e4 ** (torch.arange(0, 16, 2, device=dev).float() / 16))
        cos, sin = COMPILED.rotary_tables(positions, inv_freq, torch.float32)
        ref = EAGER.rotary_tables(positions, inv_freq, torch.float32)
        torch.testing.assert_close((cos, sin), ref)
        heads = torch.randn(2, n, 4, 16, device=dev)
        hw = torch.randn(16, device=dev)
        torch.testing.assert_close(COMPILED.norm_rotary(heads, hw, 1e-6, cos, sin),
                                   EAGER.norm_rotary(heads, hw, 1e-6, cos, sin))
        kw = torch.randn(16, device=dev)
        for weights in ((hw, kw), (None, None)):
            torch.testing.assert_close(COMPILED.qk_norm_rotary(heads, *weights, 1e-6, cos, sin, 3),
                                       EAGER.qk_norm_rotary(heads, *weights, 1e-6, cos, sin, 3))


def test_compiled_pieces_compile_one_graph_for_every_row_count(monkeypatch):
    # Dynamo's graphs counted with its eager backend (no Inductor, so the CPU runs it). A graph specialised on
    # the first call's row count, replaced by a dynamic one at the next count, ran the process's first prompt
    # through kernels no later prompt of its length met: other float32 bits on an H100
    # (benchmarks/gpu-check-pool). Wanted: one graph per piece for every N >= 2, and one for N = 1.
    from torch._dynamo.testing import CompileCounter

    import treeflash.models.kernels as kernels

    counter, real_compile = CompileCounter(), torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend=counter, **kw))
    kernels._compiled.cache_clear()
    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        inv_freq = 1.0 / (1e4 ** (torch.arange(0, 16, 2).float() / 16))
        w, hw, kw = torch.randn(64), torch.randn(16), torch.randn(16)
        graphs = []
        for n in (6, 9, 6, 13, 1, 1, 7):
            before = counter.frame_count
            x, delta = torch.randn(1, n, 64), torch.randn(1, n, 64)  # N = n rows
            COMPILED.rms_norm(x, w, 1e-6)
            COMPILED.add_rms_norm(x, delta, w, 1e-6)
            COMPILED.silu_mul(*torch.randn(1, n, 128).chunk(2, -1))
            cos, sin = COMPILED.rotary_tables(torch.arange(n)[None], inv_freq, torch.float32)
            heads = torch.randn(1, n, 4, 16)
            COMPILED.norm_rotary(heads, hw, 1e-6, cos, sin)
            COMPILED.qk_norm_rotary(heads, hw, kw, 1e-6, cos, sin, 3)
            graphs.append(counter.frame_count - before)
        # The first call compiles the six pieces, N = 1's first call their N = 1 graphs; nothing else compiles.
        assert graphs == [6, 0, 0, 0, 6, 0, 0], graphs
    finally:
        kernels._compiled.cache_clear()
        torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_stacked_cache_compacts_every_layer_like_per_layer_tensors(dtype):
    # (16-bit caches move their rows as int16 on the CPU, where PyTorch's scatter of them copied the whole cache)
    from treeflash.kv_cache import KVCache

    torch.manual_seed(0)
    stacked = KVCache.allocate(3, 4, 2, 16, 8, dtype, "cpu")
    for t in stacked.stacked:
        t.copy_(torch.randn_like(t))
    assert stacked.keys[1].data_ptr() == stacked.stacked[0][1].data_ptr()  # the layers are views
    plain = KVCache([k.clone() for k in stacked.keys], [v.clone() for v in stacked.values])
    start, keep = torch.tensor([2, 0, 5]), torch.tensor([[0, 3, 1], [0, 1, 2], [0, 4, 4]])
    part = stacked.slots(0, 3)  # a round's prefix of the slots writes through
    part.compact(start, keep)
    plain_part = KVCache([k[:3] for k in plain.keys], [v[:3] for v in plain.values])
    plain_part.compact(start, keep)
    assert all(torch.equal(a, b) for a, b in zip(stacked.keys + stacked.values, plain.keys + plain.values))
    # and the moves are those of the values themselves: float32 copies moved alike hold the same numbers
    narrow = KVCache([k[:3].clone() for k in plain.keys], [v[:3].clone() for v in plain.values])
    wide = KVCache([k.float() for k in narrow.keys], [v.float() for v in narrow.values])
    for cache in (narrow, wide):
        cache.compact(start, keep)
    assert all(torch.equal(a.float(), b) for a, b in zip(narrow.keys + narrow.values, wide.keys + wide.values))
    k, v = torch.randn(3, 2, 2, 8).to(dtype), torch.randn(3, 2, 8, 2).to(dtype).transpose(2, 3)  # v strided
    rows = torch.tensor([[7, 9], [0, 1], [15, 3]])
    narrow.write(1, k, v, rows)
    wide.write(1, k.float(), v.float(), rows)
    assert torch.equal(narrow.keys[1].float(), wide.keys[1]) and torch.equal(narrow.values[1].float(), wide.values[1])
    for cache in (stacked, plain):  # in place, keys first (the engine's growth): the same rows, new tensors
        before = [t.clone() for t in cache.keys + cache.values]
        cache.resize_(32)
        assert cache.capacity == 32 and (cache.stacked is not None) == (cache is stacked)
        assert all(torch.equal(g[:, :, :16], b) and not g[:, :, 16:].any()
                   for g, b in zip(cache.keys + cache.values, before))
        cache.resize_(8)  # (an idle engine's shrink): the first rows
        assert cache.capacity == 8 and (cache.stacked is not None) == (cache is stacked)
        assert all(torch.equal(g, b[:, :, :8]) for g, b in zip(cache.keys + cache.values, before))
    assert all(k.data_ptr() == s.data_ptr() for k, s in zip(stacked.keys, stacked.stacked[0]))  # views of the stack


def test_default_backend_follows_the_measured_rule():
    from treeflash.attention import default_backend

    assert default_backend("cpu", 128) == "sdpa"
    assert default_backend("cuda", 128) == default_backend("cuda", 64) == "splitkv"  # Qwen3-8B, SmolLM2
    assert default_backend("cuda", 80) == "flex"  # splitkv tiles power-of-two head dimensions only
    assert default_backend("cuda", 256) == "splitkv"  # Gemma 3's, run on an H100 (benchmarks/gpu-new-archs)
    # wider heads, never run through splitkv: flex, or sdpa where windows rule flex out
    assert default_backend("cuda", 512) == "flex" and default_backend("cuda", 512, flex=False) == "sdpa"
    assert default_backend("cuda", 8) == "sdpa"  # below FlexAttention's 16 too (a tiny test model's)
    from treeflash.attention import check_backend

    with pytest.raises(ValueError, match="flex attention backend needs a head dimension of at least 16"):
        check_backend("flex", "cuda", head_dim=8)


def test_hybrid_takes_splitkv_for_few_folded_rows_and_flex_past_them():
    pytest.importorskip("torch.nn.attention.flex_attention")
    from treeflash.attention import HYBRID_SLOT_ROWS, HYBRID_SPLITKV_ROWS, HybridMask, SplitKVMask

    assert HYBRID_SPLITKV_ROWS >= 2 * HYBRID_SLOT_ROWS
    seq = torch.tensor([130, 7])  # two slots: folded rows = 2 x tokens x groups
    for t, groups, want in [(1, 4, SplitKVMask), (64, 4, SplitKVMask), (65, 4, FlexMask), (16, 17, FlexMask),
                            (1, HYBRID_SPLITKV_ROWS // 2, SplitKVMask), (257, 1, FlexMask)]:
        new = torch.ones(2, t, t, dtype=torch.bool).tril()
        rows, mask = round_layout(seq, new, 512, "hybrid")
        assert isinstance(mask, HybridMask) and mask.shape[-1] == 512 and torch.equal(rows[:, 0], seq)
        assert isinstance(mask.pick(t, groups), want), (t, groups)
        assert torch.equal(mask.splitkv.new_mask.bool(), new) and torch.equal(mask.splitkv.seq_lens, seq.int())


def test_triton_cache_dir_is_pinned_once_for_every_kernel(tmp_path, monkeypatch):
    # Inductor points $TRITON_CACHE_DIR at its own directory the first time it builds a kernel wrapper; a CUDA
    # engine pins it first, so every process of a machine looks in the same place for every kernel.
    from treeflash.models.kernels import pin_triton_cache_dir

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TREEFLASH_CACHE", str(tmp_path))
    assert pin_triton_cache_dir() == str(tmp_path / "triton") == os.environ["TRITON_CACHE_DIR"]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))  # the user's choice stands
    assert pin_triton_cache_dir() == str(tmp_path / "mine") == os.environ["TRITON_CACHE_DIR"]


def test_a_cpu_engine_leaves_the_triton_cache_alone(pair, monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    target, drafter = pair
    LLM(str(target), draft_model=str(drafter), device="cpu", dtype="float32", max_model_len=64)
    assert "TRITON_CACHE_DIR" not in os.environ

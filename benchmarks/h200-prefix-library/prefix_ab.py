"""A tree's attention in two parts: the committed prefix through PyTorch's own attention kernels, the new rows
through ours. Timed cold, as a round meets it (one CUDA graph of 36 calls over 36 layers' caches, Qwen3-8B heads,
context 1,024), us per call; each candidate's output (and log-sum-exp) against a float32 reference.

Every new token of a round sees every committed row, so the prefix part needs no mask and its query heads can be
folded onto their KV head (G x T rows per KV head): a plain, unmasked attention that library kernels (FlashAttention
2 inside PyTorch, cuDNN, the memory-efficient kernel) run. If prefix + new rows costs less than the splitkv call that
does both, the new-rows kernel could start its online softmax from the prefix's (out, lse).

    python3 benchmarks/h200-prefix-library/prefix_ab.py OUT.json
"""

from __future__ import annotations

import json
import math
import sys
import traceback

import torch

sys.path.insert(0, "benchmarks")
from splitkv_ab import tree_mask  # noqa: E402
from tree_kernel_ab import time_graph  # noqa: E402

import treeflash.splitkv_attention as K  # noqa: E402
from treeflash.kv_cache import KVCache  # noqa: E402

DEV = torch.device("cuda")
DTYPE = torch.bfloat16
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
GROUPS = HEADS // KV_HEADS
CONTEXT = 1024
LAYERS = 36
SCALE = HEAD_DIM ** -0.5
results: list[dict] = []


def record(t: int, name: str, fn, check=None) -> None:
    try:
        err = check() if check else None
        us = time_graph(fn, reps=20)[0] / LAYERS
    except Exception as e:  # an op this torch lacks, or a layout it refuses, is recorded, not fatal
        msg = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()[-1][:200]
        print(f"t={t} {name}: FAIL {msg}", flush=True)
        results.append({"t": t, "name": name, "error": msg})
        return
    print(f"t={t} {name}: {us:.2f} us" + ("" if err is None else f"  err {err}"), flush=True)
    results.append({"t": t, "name": name, "us": us, "err": err})


def main() -> None:
    out_path = sys.argv[1]
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for op in ("_flash_attention_forward", "_scaled_dot_product_cudnn_attention", "_efficient_attention_forward"):
        print(getattr(torch.ops.aten, op).default._schema, flush=True)
    for t in (65, 257):
        gen = torch.Generator().manual_seed(t)
        capacity = CONTEXT + 512
        cache = KVCache.allocate(LAYERS, 1, KV_HEADS, capacity, HEAD_DIM, DTYPE, DEV)
        for tensor in cache.stacked:
            tensor.copy_(torch.randn(tensor.shape, generator=gen).to(DTYPE))
        q = torch.randn(1, HEADS, t, HEAD_DIM, generator=gen).to(DEV, DTYPE)
        new_k, new_v = (torch.randn(1, KV_HEADS, t, HEAD_DIM, generator=gen).to(DEV, DTYPE) for _ in range(2))
        mask8 = tree_mask(1, t, gen).to(DEV).to(torch.uint8)
        seq32 = torch.full((1,), CONTEXT, device=DEV, dtype=torch.int32)
        zero32 = torch.zeros(1, device=DEV, dtype=torch.int32)

        # The reference for the prefix: folded rows r = g * T + t of KV head h.
        qf = q[0].reshape(KV_HEADS, GROUPS * t, HEAD_DIM)  # [Hkv, G*T, D] (query head h*G+g)
        k0 = cache.keys[0][0, :, :CONTEXT].float()
        v0 = cache.values[0][0, :, :CONTEXT].float()
        s = qf.float() @ k0.transpose(1, 2) * SCALE
        lse_ref = torch.logsumexp(s, -1)  # [Hkv, G*T]
        out_ref = torch.softmax(s, -1) @ v0  # [Hkv, G*T, D]

        def err_of(out, lse=None, layout="hrd"):
            o = out.float()
            if layout == "rhd":
                o = o.transpose(0, 1)
            e = {"out": (o.reshape(out_ref.shape) - out_ref).abs().max().item()}
            if lse is not None:
                e["lse"] = (lse.float().reshape(lse_ref.shape) - lse_ref).abs().max().item()
            return e

        # 1. ours, the whole call (prefix + new rows + storing them), and the new rows alone (seq 0).
        def ours(layer, seq=seq32):
            return K.splitkv_attention(q, cache.keys[layer], cache.values[layer], seq, mask8, new_k, new_v)
        record(t, "splitkv whole call", lambda: [ours(i) for i in range(LAYERS)])
        record(t, "splitkv new rows only (seq 0, the rule's splits)", lambda: [ours(i, zero32) for i in range(LAYERS)])
        rule = K.num_splits
        K.num_splits = lambda *a, **k: 1
        try:
            record(t, "splitkv new rows only (seq 0, 1 split)", lambda: [ours(i, zero32) for i in range(LAYERS)])
        finally:
            K.num_splits = rule

        # 2. FlashAttention 2 (PyTorch's), varlen over the cache as [L, Hkv, D] views, seqused_k on the device.
        q_rhd = qf.transpose(0, 1).contiguous()  # [G*T, Hkv, D]
        q_gqa = q[0].transpose(0, 1).contiguous()  # [T, H, D]
        cu_q_fold = torch.tensor([0, GROUPS * t], device=DEV, dtype=torch.int32)
        cu_q_gqa = torch.tensor([0, t], device=DEV, dtype=torch.int32)
        cu_k = torch.tensor([0, capacity], device=DEV, dtype=torch.int32)
        kv_views = [(cache.keys[i][0].transpose(0, 1), cache.values[i][0].transpose(0, 1)) for i in range(LAYERS)]

        def flash(layer, qq, cu_q, max_q, splits=None):
            k, v = kv_views[layer]
            extra = {} if splits is None else {"num_splits": splits}
            return torch.ops.aten._flash_attention_forward(
                qq, k, v, cu_q, cu_k, max_q, capacity, 0.0, False, False, scale=SCALE, seqused_k=seq32, **extra)[:2]

        for splits in (None, 1, 2, 4, 8):
            tag = "" if splits is None else f", num_splits {splits}"
            record(t, f"flash varlen folded{tag}", lambda s=splits: [flash(i, q_rhd, cu_q_fold, GROUPS * t, s)
                                                                    for i in range(LAYERS)],
                   lambda s=splits: err_of(*flash(0, q_rhd, cu_q_fold, GROUPS * t, s), layout="rhd"))
        record(t, "flash varlen gqa (T x 32 heads)", lambda: [flash(i, q_gqa, cu_q_gqa, t) for i in range(LAYERS)])

        # 3. cuDNN (fixed length: the prefix sliced to the context; no device-side length).
        q_b = qf.unsqueeze(0)  # [1, Hkv, G*T, D]

        def cudnn(layer):
            k = cache.keys[layer][:, :, :CONTEXT]
            v = cache.values[layer][:, :, :CONTEXT]
            return torch.ops.aten._scaled_dot_product_cudnn_attention(q_b, k, v, None, True, scale=SCALE)[:2]
        record(t, "cudnn folded, fixed length", lambda: [cudnn(i) for i in range(LAYERS)],
               lambda: err_of(cudnn(0)[0][0], cudnn(0)[1]))

        # 4. The memory-efficient kernel (BMHK layout), seqlen_k on the device.
        q_bmhk = q_rhd.unsqueeze(0)  # [1, G*T, Hkv, D]
        cu_k_eff = torch.tensor([0, capacity], device=DEV, dtype=torch.int32)

        def efficient(layer):
            k, v = kv_views[layer]
            return torch.ops.aten._efficient_attention_forward(
                q_bmhk, k.unsqueeze(0), v.unsqueeze(0), None, None, None, None, None, 0.0, 0, True,
                scale=SCALE, seqlen_k=seq32)[:2]
        record(t, "efficient folded, seqlen_k", lambda: [efficient(i) for i in range(LAYERS)],
               lambda: err_of(efficient(0)[0][0], efficient(0)[1][0, :, :GROUPS * t], layout="rhd"))

        # 5. SDPA as users call it (fixed length, no lse): what PyTorch's dispatcher picks.
        def sdpa(layer):
            k = cache.keys[layer][:, :, :CONTEXT]
            v = cache.values[layer][:, :, :CONTEXT]
            return torch.nn.functional.scaled_dot_product_attention(q_b, k, v, scale=SCALE)
        record(t, "F.sdpa folded, fixed length", lambda: [sdpa(i) for i in range(LAYERS)],
               lambda: err_of(sdpa(0)[0]))
        del cache
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "context": CONTEXT,
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

"""Experimental variants of treeflash.splitkv_attention._partial for one slot's tree (STORE_NEW only):
PRESCALE folds the softmax scale into one FMA per score; WS asks Triton to warp-specialise the committed
loop; DESC loads committed K/V tiles through host-side TMA tensor descriptors."""
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import treeflash.splitkv_attention as K


@triton.jit
def _tile(q, k, v, m_i, l_i, acc, qk_scale, PRECISION: tl.constexpr, PRESCALE: tl.constexpr):
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if PRESCALE:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    else:
        p, alpha, m_i, l_i = K._softmax_step(s * qk_scale, m_i, l_i)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_i, l_i


@triton.jit
def _committed_kv(KD, VD, k_base, v_base, row, n0, sk_n, sv_n, d, BLOCK_N: tl.constexpr, DESC: tl.constexpr):
    # One whole committed K/V tile: through the TMA descriptors (row in the [slots x heads x capacity] view) or
    # through pointers.
    if DESC:
        return KD.load([row, 0]), VD.load([row, 0])
    cols = n0 + tl.arange(0, BLOCK_N)
    return tl.load(k_base + cols[:, None] * sk_n + d[None, :]), tl.load(v_base + cols[:, None] * sv_n + d[None, :])


@triton.jit
def _partial_x(Q, K_, V_, KD, VD, NewK, NewV, SeqLens, NewMask, Out, PartAcc, PartMax, PartSum,
               sq_b, sq_h, sq_t, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, snk_b, snk_h, snk_t, snv_b, snv_h, snv_t,
               sm_b, sm_q, sm_k, so_b, so_t, scale, KV_HEADS, GROUPS, T, ROWS, CAP,
               NUM_SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
               PRECISION: tl.constexpr, PRESCALE: tl.constexpr, WS: tl.constexpr, DESC: tl.constexpr,
               STAGES: tl.constexpr):
    bh = tl.program_id(0)
    m_block = tl.program_id(1)
    split = tl.program_id(2)
    b = bh // KV_HEADS
    h = bh % KV_HEADS
    seq = tl.load(SeqLens + b)
    end = seq + T
    per_split = tl.cdiv(tl.cdiv(end, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    stop = tl.minimum(start + per_split, end)
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < ROWS
    g = rows // T
    t = rows % T
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * sq_b + (h * GROUPS + g)[:, None] * sq_h + t[:, None] * sq_t + d[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    k_base = K_ + b * sk_b + h * sk_h
    v_base = V_ + b * sv_b + h * sv_h
    new_k_base = NewK + b * snk_b + h * snk_h
    new_v_base = NewV + b * snv_b + h * snv_h
    if (m_block == 0) & (split == 0):
        for t0 in range(0, T, BLOCK_N):
            tt = t0 + tl.arange(0, BLOCK_N)
            ok = (tt < T)[:, None]
            tl.store(k_base + (seq + tt)[:, None] * sk_n + d[None, :],
                     tl.load(new_k_base + tt[:, None] * snk_t + d[None, :], mask=ok), mask=ok)
            tl.store(v_base + (seq + tt)[:, None] * sv_n + d[None, :],
                     tl.load(new_v_base + tt[:, None] * snv_t + d[None, :], mask=ok), mask=ok)
    qk_scale = scale * 1.4426950408889634
    committed = tl.maximum(tl.minimum(stop, seq), start)
    whole = start + (committed - start) // BLOCK_N * BLOCK_N
    row0 = bh * CAP
    if WS:
        for n0 in tl.range(start, whole, BLOCK_N, num_stages=STAGES, warp_specialize=True):
            k, v = _committed_kv(KD, VD, k_base, v_base, row0 + n0, n0, sk_n, sv_n, d, BLOCK_N, DESC)
            acc, m_i, l_i = _tile(q, k, v, m_i, l_i, acc, qk_scale, PRECISION, PRESCALE)
    else:
        for n0 in tl.range(start, whole, BLOCK_N, num_stages=STAGES):
            k, v = _committed_kv(KD, VD, k_base, v_base, row0 + n0, n0, sk_n, sv_n, d, BLOCK_N, DESC)
            acc, m_i, l_i = _tile(q, k, v, m_i, l_i, acc, qk_scale, PRECISION, PRESCALE)
    for n0 in range(whole, committed, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < committed
        k = tl.load(k_base + cols[:, None] * sk_n + d[None, :], mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        p, alpha, m_i, l_i = K._softmax_step(tl.where(col_ok[None, :], s, float("-inf")), m_i, l_i)
        v = tl.load(v_base + cols[:, None] * sv_n + d[None, :], mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    for n0 in range(tl.maximum(start, seq), stop, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        is_new = cols < stop
        rel = cols - seq
        k = tl.load(new_k_base + rel[:, None] * snk_t + d[None, :], mask=is_new[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        allowed = tl.load(NewMask + b * sm_b + t[:, None] * sm_q + rel[None, :] * sm_k,
                          mask=row_ok[:, None] & is_new[None, :], other=0)
        p, alpha, m_i, l_i = K._softmax_step(tl.where(allowed != 0, s, float("-inf")), m_i, l_i)
        v = tl.load(new_v_base + rel[:, None] * snv_t + d[None, :], mask=is_new[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(Out + b * so_b + t[:, None] * so_t + (h * GROUPS + g)[:, None] * HEAD_DIM + d[None, :],
                 out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        part = (bh * NUM_SPLITS + split) * (tl.num_programs(1) * BLOCK_M) + rows
        tl.store(PartAcc + part[:, None] * HEAD_DIM + d[None, :], acc)
        tl.store(PartMax + part, m_i)
        tl.store(PartSum + part, l_i)


def attention(q, k, v, seq_lens, new_mask, new_k, new_v, launch, splits=None, prescale=False, ws=False,
              desc=False, info=None, descs=None):
    batch, heads, t, head_dim = q.shape
    kv_heads, capacity = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    rows = groups * t
    block_m = min(launch.max_block_m, max(16, triton.next_power_of_2(rows)))
    m_blocks = triton.cdiv(rows, block_m)
    if splits is None:
        splits = K.num_splits(batch * kv_heads * m_blocks, capacity, q.device, launch)
    out = torch.empty(batch, t, heads * head_dim, dtype=q.dtype, device=q.device)
    if splits > 1:
        parts = batch * kv_heads * splits * m_blocks * block_m
        part_acc = torch.empty(parts, head_dim, dtype=torch.float32, device=q.device)
        part_max = torch.empty(parts, dtype=torch.float32, device=q.device)
        part_sum = torch.empty(parts, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_max = part_sum = out
    if desc:
        kd, vd = descs if descs is not None else (
            TensorDescriptor.from_tensor(k.view(-1, head_dim), [launch.block_n, head_dim]),
            TensorDescriptor.from_tensor(v.view(-1, head_dim), [launch.block_n, head_dim]))
    else:
        kd = vd = k
    stages = launch.num_stages or 2
    kern = _partial_x[(batch * kv_heads, m_blocks, splits)](
        q, k, v, kd, vd, new_k, new_v, seq_lens, new_mask, out, part_acc, part_max, part_sum,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), new_k.stride(0), new_k.stride(1), new_k.stride(2),
        new_v.stride(0), new_v.stride(1), new_v.stride(2), new_mask.stride(0), new_mask.stride(1),
        new_mask.stride(2), out.stride(0), out.stride(1), head_dim ** -0.5, kv_heads, groups, t, rows, capacity,
        NUM_SPLITS=splits, BLOCK_M=block_m, BLOCK_N=launch.block_n, HEAD_DIM=head_dim,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", PRESCALE=prescale, WS=ws, DESC=desc,
        STAGES=stages, num_warps=launch.num_warps, num_stages=stages)
    if info is not None:
        info.append(kern)
    if splits > 1:
        merge_m = max(1, min(16, K.MERGE_TILE // (splits * head_dim)))
        merge_m = 1 << (merge_m.bit_length() - 1)
        K._merge[(batch * kv_heads, triton.cdiv(rows, merge_m))](
            out, part_acc, part_max, part_sum, out.stride(0), out.stride(1), kv_heads, groups, t, rows,
            m_blocks * block_m, NUM_SPLITS=splits, MERGE_M=merge_m, HEAD_DIM=head_dim)
    return out

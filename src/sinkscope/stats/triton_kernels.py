"""Triton kernels for the call statistics: streaming passes, scores never stored.

Kernel 1, ``_frame_softmax_partials`` (always): each program owns BLOCK_M queries of one
head and one key frame, the frame being a contiguous segment of k (start and length
read from two small int32 tensors, so frames may be partial and in any order). It
streams that segment in tiles of BLOCK_N and keeps per query, with t = q.k * scale *
log2(e) (base-2 scores):

- m, the running max of t;
- l = sum 2^(t - m), rescaled by 2^(m_old - m_new) whenever m grows;
- u = sum 2^(t - m) (m - t), rescaled the same way (plus (m_new - m_old) l for the
  shift of the centre). Every term is >= 0, so no cancellation; from it comes the
  entropy without a second pass;
- the sum of the raw scores q.k, for logit_mean (kept elementwise in a [BLOCK_M,
  BLOCK_N] tile and reduced over keys once at the end: about 6% faster than a row sum
  per tile on an H100).

The output is (m, l, u, sum) per (head, query token, key frame): a few MiB. torch then
combines the frames per query: M = max_f m_f, L = sum_f l_f 2^(m_f - M);
mass_f = l_f 2^(m_f - M) / L; entropy (nats) = ln L + ln 2 * sum_f 2^(m_f - M)
(u_f + (M - m_f) l_f) / L (the identity H = lse - E_p[s] with E_p[M - t] accumulated
directly); the argmax frame = argmax_f m_f (ties: the lowest frame position).

Kernel 2, ``_token_profiles`` (only for token profiles): a second streaming pass
that reuses each query's M and 1/L from the combine. Its grid is (key tiles of
BLOCK_N, heads); each program holds its key tile and loops over all query blocks,
computing p = 2^(t - M) / L and accumulating it elementwise in a [BLOCK_M, BLOCK_N]
register tile, reduced over the queries once at the end. It writes [H, Lk] column sums:
O(keys) memory, and one more QK^T over the call, so it costs about what kernel 1 does.
It is a separate pass because the column sums need every query's final normalizer,
which only exists once kernel 1 has seen all keys. The same program also writes each
key's mean logit (mean_i q_i) . k_j from its tile (exact by factorization, in fp32,
with no fp32 copy of q or k).

Splitting kernel 1's grid by key frame gives 3 x 12 x ceil(Lq / BLOCK_M) independent
programs even for the first block, needs no per-frame accumulators in registers, and
works for any number of key frames (sliding windows, sinks, long videos).

Measured on an H100 at the last block's shape (12 heads, 4680 queries, 32760 keys,
bf16, 2026-11-22; medians, run-to-run noise up to ~20%): kernel 1 1.48-1.50 ms (the
version without entropy: ~1.40), every frame statistic with the combine 1.65-1.80 ms,
kernel 2 1.03-1.33 ms, the attention call itself (SDPA) 1.75-1.79 ms. Extra memory
with token profiles: 37 MiB (the score matrix would be 613 MiB per head in fp32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import torch
import triton
import triton.language as tl

from sinkscope.stats.reference import CallStatistics, one_hot_float, token_mean

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

# Measured on H100 and H200 (docs/performance.md): all four within 8% of each other, the
# first best or tied; it is the default, used without autotuning so that a fresh job pays
# no tuning runs. Re-measured on an H100 with the entropy accumulator: 128x64 (8 warps,
# 3 stages) 1.51 ms, 64x64 (4, 3) 1.56 ms, 128x128 (8, 2) 2.06 ms (register pressure).
DEFAULT_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=3),
]
# Kernel 2 holds a key tile (BLOCK_N) and streams query tiles (BLOCK_M). H100, last
# block: 64x128 (4 warps, 3 stages) 1.03-1.08 ms, (8, 3) 1.11-1.13, 128x64 (8, 3)
# 1.15-1.23, 64x64 (4, 3) 1.12-1.18, 128x128 (8, 2) 1.54-1.60. Fixed, no autotuning.
DEFAULT_PROFILE_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3}
# Kernel 4 (the statistics given each query's log-sum-exp). H100, last block, 2026-11-25:
# 128x64 (8 warps, 4 stages) 1.43 ms, (8, 3) 1.56, 64x64 (4, 3) 1.46, 64x128 (4, 3) 1.63,
# 128x128 (8, 3) 1.79, 256x64 (8, 3) 1.77. Fixed, no autotuning.
DEFAULT_LSE_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 4}
# Kernel 3 (attention output + frame partials): a flash-attention forward's tiles.
DEFAULT_FUSED_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
# Small tiles for Triton's CPU interpreter (tests): fast, and every masking path taken.
# Under the interpreter the loops run to compile-time bounds (see _interpreter_loop_end).
INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 16}


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _load_rows(base, stride_row, offs_row, row_valid, offs_d, d_valid):
    """A [rows, D_PAD] tile of a [L, D] matrix (one head's q); padding reads 0."""
    return tl.load(base + offs_row[:, None] * stride_row + offs_d[None, :], mask=row_valid[:, None] & d_valid[None, :],
                   other=0.0)  # fmt: skip


@triton.jit
def _frame_softmax_partials(
    q_ptr,
    k_ptr,
    starts_ptr,
    lengths_ptr,
    m_ptr,
    l_ptr,
    u_ptr,
    sum_ptr,
    stride_qh,
    stride_ql,
    stride_kh,
    stride_kl,
    num_queries,
    num_key_frames,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    IEEE: tl.constexpr,
    LOOP_END: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    frame = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    m_valid = offs_m < num_queries
    d_valid = offs_d < HEAD_DIM
    q = _load_rows(q_ptr + head * stride_qh, stride_ql, offs_m, m_valid, offs_d, d_valid)
    seg_start = tl.load(starts_ptr + frame)
    seg_len = tl.load(lengths_ptr + frame)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    u_i = tl.zeros([BLOCK_M], tl.float32)
    # Raw scores summed elementwise, reduced over keys once at the end (cheaper than a
    # row reduction per tile). Keys past the segment load as 0 and add 0.
    raw_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_seg = k_ptr + head * stride_kh + seg_start * stride_kl
    # In Triton's interpreter (LOOP_END > 0, see _interpreter_loop_end) every program runs
    # to the longest segment, its extra tiles fully masked (they change nothing: p = 0).
    # (A conditional expression, not an assignment: the interpreter makes tensors of those.)
    for start in range(0, LOOP_END if LOOP_END > 0 else seg_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_valid = offs_n < seg_len
        k = tl.load(
            k_seg + offs_n[None, :] * stride_kl + offs_d[:, None],
            mask=n_valid[None, :] & d_valid[:, None],
            other=0.0,
        )
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)
        raw_acc += s
        t_all = s * qk_scale_log2
        t = tl.where(n_valid[None, :], t_all, float("-inf"))
        # The first tile holds at least one valid key (seg_len >= 1), so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(t, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(t - m_new[:, None])
        # Finite everywhere (t_all, not t), so p = 0 on masked keys gives 0, not 0 * inf.
        below = m_new[:, None] - t_all
        # Where nothing was seen yet (l = 0, m = -inf) the centre shift is 0, not inf * 0.
        shift = tl.where(l_i > 0.0, m_new - m_i, 0.0)
        u_i = alpha * (u_i + shift * l_i) + tl.sum(p * below, 1)
        l_i = alpha * l_i + tl.sum(p, 1)
        m_i = m_new
    out = (head * num_queries + offs_m) * num_key_frames + frame
    tl.store(m_ptr + out, m_i, mask=m_valid)
    tl.store(l_ptr + out, l_i, mask=m_valid)
    tl.store(u_ptr + out, u_i, mask=m_valid)
    tl.store(sum_ptr + out, tl.sum(raw_acc, 1), mask=m_valid)


@triton.jit
def _fused_tile(
    q,
    k_seg,
    v_seg,
    start,
    seg_len,
    acc,
    g_i,
    big_l,
    m_f,
    l_f,
    w_f,
    key_sum,
    stride_kl,
    stride_vl,
    offs_d,
    d_valid,
    qk_scale_log2,
    sum_keys,
    MASKED: tl.constexpr,
    EVEN_D: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One key tile of kernel 3 (inlined). Unmasked tiles skip every per-score select."""
    offs_n = start + tl.arange(0, BLOCK_N)
    k_ptrs = k_seg + offs_n[None, :] * stride_kl + offs_d[:, None]
    v_ptrs = v_seg + offs_n[:, None] * stride_vl + offs_d[None, :]
    if MASKED:
        n_valid = offs_n < seg_len
        k = tl.load(k_ptrs, mask=n_valid[None, :] & d_valid[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=n_valid[:, None] & d_valid[None, :], other=0.0)
    elif EVEN_D:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_valid[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=d_valid[None, :], other=0.0)
    if IEEE:
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    t = s * qk_scale_log2
    if MASKED:
        t = tl.where(n_valid[None, :], t, float("-inf"))
    tile_max = tl.max(t, 1)
    m_f = tl.maximum(m_f, tile_max)
    g_new = tl.maximum(g_i, tile_max)
    alpha = tl.exp2(g_i - g_new)
    p = tl.exp2(t - g_new[:, None])
    p_sum = tl.sum(p, 1)
    # sum p t for the entropy; masked keys have p = 0 (t is -inf there: use 0 instead).
    if MASKED:
        p_t = tl.sum(p * tl.where(n_valid[None, :], t, 0.0), 1)
    else:
        p_t = tl.sum(p * t, 1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    big_l = big_l * alpha + p_sum
    l_f = l_f * alpha + p_sum
    w_f = w_f * alpha + p_t
    if sum_keys:
        key_sum += tl.sum(k.to(tl.float32), 1)
    return acc, g_new, big_l, m_f, l_f, w_f, key_sum


@triton.jit
def _attention_frame_partials(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    starts_ptr,
    lengths_ptr,
    m_ptr,
    g_ptr,
    l_ptr,
    w_ptr,
    key_sum_ptr,
    stride_qh,
    stride_ql,
    stride_kh,
    stride_kl,
    stride_vh,
    stride_vl,
    stride_oh,
    stride_ol,
    num_queries,
    num_key_frames,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    IEEE: tl.constexpr,
    LOOP_END: tl.constexpr,
    FRAMES_END: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Kernel 3: the attention output and every frame statistic's partials in one pass.

    A flash-attention forward (one running max G per query, the output accumulator and
    its normalizer L rescaled when G grows) whose key loop runs frame by frame and keeps,
    per frame, sums relative to the same G: l_f = sum 2^(t - G) and w_f = sum 2^(t - G) t,
    rescaled with the accumulator, and the frame's own max m_f (for argmax_share). When a
    frame ends it stores (m_f, G, l_f, w_f); the combine brings every frame to the final
    max. Per score this adds one multiply-add (p t) to flash attention's work. Programs of
    the first query block also sum each frame's keys (for logit_mean by factorization).
    """
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    m_valid = offs_m < num_queries
    d_valid = offs_d < HEAD_DIM
    q = _load_rows(q_ptr + head * stride_qh, stride_ql, offs_m, m_valid, offs_d, d_valid)
    sum_keys = pid_m == 0
    g_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    big_l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    # LOOP_END / FRAMES_END > 0 in Triton's interpreter only (see _interpreter_loop_end):
    # there every tile is masked and every loop runs to a compile-time bound.
    for frame in range(0, FRAMES_END if FRAMES_END > 0 else num_key_frames):
        seg_start = tl.load(starts_ptr + frame)
        seg_len = tl.load(lengths_ptr + frame)
        k_seg = k_ptr + head * stride_kh + seg_start * stride_kl
        v_seg = v_ptr + head * stride_vh + seg_start * stride_vl
        m_f = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_f = tl.zeros([BLOCK_M], tl.float32)
        w_f = tl.zeros([BLOCK_M], tl.float32)
        key_sum = tl.zeros([D_PAD], tl.float32)
        if LOOP_END > 0:
            for start in range(0, LOOP_END, BLOCK_N):
                acc, g_i, big_l, m_f, l_f, w_f, key_sum = _fused_tile(
                    q, k_seg, v_seg, start, seg_len, acc, g_i, big_l, m_f, l_f, w_f, key_sum, stride_kl, stride_vl,
                    offs_d, d_valid, qk_scale_log2, sum_keys, True, D_PAD == HEAD_DIM, IEEE, BLOCK_N,
                )  # fmt: skip
        else:
            whole = (seg_len // BLOCK_N) * BLOCK_N
            for start in range(0, whole, BLOCK_N):
                acc, g_i, big_l, m_f, l_f, w_f, key_sum = _fused_tile(
                    q, k_seg, v_seg, start, seg_len, acc, g_i, big_l, m_f, l_f, w_f, key_sum, stride_kl, stride_vl,
                    offs_d, d_valid, qk_scale_log2, sum_keys, False, D_PAD == HEAD_DIM, IEEE, BLOCK_N,
                )  # fmt: skip
            if whole < seg_len:
                acc, g_i, big_l, m_f, l_f, w_f, key_sum = _fused_tile(
                    q, k_seg, v_seg, whole, seg_len, acc, g_i, big_l, m_f, l_f, w_f, key_sum, stride_kl, stride_vl,
                    offs_d, d_valid, qk_scale_log2, sum_keys, True, D_PAD == HEAD_DIM, IEEE, BLOCK_N,
                )  # fmt: skip
        out = (head * num_queries + offs_m) * num_key_frames + frame
        tl.store(m_ptr + out, m_f, mask=m_valid)
        tl.store(g_ptr + out, g_i, mask=m_valid)
        tl.store(l_ptr + out, l_f, mask=m_valid)
        tl.store(w_ptr + out, w_f, mask=m_valid)
        if sum_keys:
            tl.store(key_sum_ptr + (head * num_key_frames + frame) * HEAD_DIM + offs_d, key_sum, mask=d_valid)
    o = acc / big_l[:, None]
    tl.store(
        o_ptr + head * stride_oh + offs_m[:, None] * stride_ol + offs_d[None, :],
        o.to(o_ptr.dtype.element_ty),
        mask=m_valid[:, None] & d_valid[None, :],
    )


@triton.jit
def _lse_tile(
    q,
    k_seg,
    start,
    seg_len,
    neg_lse,
    m_i,
    l_i,
    w_i,
    key_sum,
    stride_kl,
    offs_d,
    d_valid,
    qk_scale_log2,
    sum_keys,
    MASKED: tl.constexpr,
    EVEN_D: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One key tile of kernel 4 (inlined). Per score: one multiply-add into the exponent
    (s * scale - lse), the exponential, and three accumulations (max, sum p, sum p s) on
    the raw score s; the scale goes onto m and w once, at the end. Unmasked tiles skip
    every per-score select."""
    offs_n = start + tl.arange(0, BLOCK_N)
    k_ptrs = k_seg + offs_n[None, :] * stride_kl + offs_d[:, None]
    if MASKED:
        n_valid = offs_n < seg_len
        k = tl.load(k_ptrs, mask=n_valid[None, :] & d_valid[:, None], other=0.0)
    elif EVEN_D:
        k = tl.load(k_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_valid[:, None], other=0.0)
    if IEEE:
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    p = tl.exp2(s * qk_scale_log2 + neg_lse[:, None])
    if MASKED:  # keys past the segment loaded as 0: their score is 0, not -inf
        m_i = tl.maximum(m_i, tl.max(tl.where(n_valid[None, :], s, float("-inf")), 1))
        p = tl.where(n_valid[None, :], p, 0.0)
    else:
        m_i = tl.maximum(m_i, tl.max(s, 1))
    l_i += tl.sum(p, 1)
    w_i += tl.sum(p * s, 1)
    if sum_keys:
        key_sum += tl.sum(k.to(tl.float32), 1)
    return m_i, l_i, w_i, key_sum


@triton.jit
def _frame_partials_given_lse(
    q_ptr,
    k_ptr,
    lse_ptr,
    starts_ptr,
    lengths_ptr,
    m_ptr,
    l_ptr,
    w_ptr,
    key_sum_ptr,
    stride_qh,
    stride_ql,
    stride_kh,
    stride_kl,
    num_queries,
    num_key_frames,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    IEEE: tl.constexpr,
    LOOP_END: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Kernel 4: kernel 1's pass when the attention call already gave each query's
    log-sum-exp (``lse_ptr``: base 2, of t = q.k * scale * log2 e, [H, Lq]). Then
    p = 2^(t - lse) is final: no running max, no rescaling. Per (query, key frame) it
    stores the frame's max t (argmax_share), sum p (prob_mass) and sum p t (entropy)."""
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    frame = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    m_valid = offs_m < num_queries
    d_valid = offs_d < HEAD_DIM
    q = _load_rows(q_ptr + head * stride_qh, stride_ql, offs_m, m_valid, offs_d, d_valid)
    neg_lse = -tl.load(lse_ptr + head * num_queries + offs_m, mask=m_valid, other=0.0)
    seg_start = tl.load(starts_ptr + frame)
    seg_len = tl.load(lengths_ptr + frame)
    sum_keys = pid_m == 0
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    w_i = tl.zeros([BLOCK_M], tl.float32)
    key_sum = tl.zeros([D_PAD], tl.float32)
    k_seg = k_ptr + head * stride_kh + seg_start * stride_kl
    # LOOP_END > 0 in Triton's interpreter only (see _interpreter_loop_end): there every
    # tile is masked and the loop runs to a compile-time bound.
    if LOOP_END > 0:
        for start in range(0, LOOP_END, BLOCK_N):
            m_i, l_i, w_i, key_sum = _lse_tile(q, k_seg, start, seg_len, neg_lse, m_i, l_i, w_i, key_sum, stride_kl, offs_d,
                                               d_valid, qk_scale_log2, sum_keys, True, D_PAD == HEAD_DIM, IEEE, BLOCK_N)  # fmt: skip
    else:
        whole = (seg_len // BLOCK_N) * BLOCK_N
        for start in range(0, whole, BLOCK_N):
            m_i, l_i, w_i, key_sum = _lse_tile(q, k_seg, start, seg_len, neg_lse, m_i, l_i, w_i, key_sum, stride_kl, offs_d,
                                               d_valid, qk_scale_log2, sum_keys, False, D_PAD == HEAD_DIM, IEEE, BLOCK_N)  # fmt: skip
        if whole < seg_len:
            m_i, l_i, w_i, key_sum = _lse_tile(q, k_seg, whole, seg_len, neg_lse, m_i, l_i, w_i, key_sum, stride_kl, offs_d,
                                               d_valid, qk_scale_log2, sum_keys, True, D_PAD == HEAD_DIM, IEEE, BLOCK_N)  # fmt: skip
    out = (head * num_queries + offs_m) * num_key_frames + frame
    tl.store(m_ptr + out, m_i * qk_scale_log2, mask=m_valid)
    tl.store(l_ptr + out, l_i, mask=m_valid)
    tl.store(w_ptr + out, w_i * qk_scale_log2, mask=m_valid)
    if sum_keys:
        tl.store(key_sum_ptr + (head * num_key_frames + frame) * HEAD_DIM + offs_d, key_sum, mask=d_valid)


@triton.jit
def _token_profiles(
    q_ptr,
    k_ptr,
    row_max_ptr,
    row_inv_ptr,
    q_mean_ptr,
    prob_ptr,
    logit_ptr,
    stride_qh,
    stride_ql,
    stride_kh,
    stride_kl,
    num_queries,
    num_keys,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    IEEE: tl.constexpr,
    LOOP_END: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_n = tl.program_id(0)
    head = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    n_valid = offs_n < num_keys
    d_valid = offs_d < HEAD_DIM
    k = tl.load(
        k_ptr + head * stride_kh + offs_n[None, :] * stride_kl + offs_d[:, None],
        mask=n_valid[None, :] & d_valid[:, None],
        other=0.0,
    )
    # The mean score of each key over every query: (mean_i q_i) . k_j, in fp32.
    q_mean = tl.load(q_mean_ptr + head * HEAD_DIM + offs_d, mask=d_valid, other=0.0)
    logit = tl.sum(k.to(tl.float32) * q_mean[:, None], 0)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    # LOOP_END > 0 in Triton's interpreter only (see _interpreter_loop_end).
    for start in range(0, LOOP_END if LOOP_END > 0 else num_queries, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        m_valid = offs_m < num_queries
        q = _load_rows(q_ptr + head * stride_qh, stride_ql, offs_m, m_valid, offs_d, d_valid)
        # Rows past the end read max 0 and 1/L 0: their p is exactly 0.
        row_max = tl.load(row_max_ptr + head * num_queries + offs_m, mask=m_valid, other=0.0)
        row_inv = tl.load(row_inv_ptr + head * num_queries + offs_m, mask=m_valid, other=0.0)
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)
        # Columns past the end are never stored, so they need no mask here.
        acc += tl.exp2(s * qk_scale_log2 - row_max[:, None]) * row_inv[:, None]
    tl.store(prob_ptr + head * num_keys + offs_n, tl.sum(acc, 0), mask=n_valid)
    tl.store(logit_ptr + head * num_keys + offs_n, logit, mask=n_valid)


def _launch_config(config: dict | None, default: dict) -> tuple[dict, dict]:
    """(kernel meta-parameters, launch options): ``config`` over the default."""
    config = {**(INTERPRETER_CONFIG if _interpreting() else default), **(config or {})}
    launch = {key: config.pop(key) for key in ("num_warps", "num_stages") if key in config}
    return config, launch


def _constants(q: torch.Tensor) -> dict:
    head_dim = q.shape[-1]
    return dict(HEAD_DIM=head_dim, D_PAD=max(16, triton.next_power_of_2(head_dim)), IEEE=q.dtype == torch.float32)


def _interpreter_loop_end(end: int) -> int:
    """The kernels' LOOP_END: 0 on the GPU (each loop runs to its runtime bound); in
    Triton's interpreter the bound itself, as a compile-time constant. The interpreter of
    Triton 3.6 and earlier turns runtime loop bounds (even plain int arguments) into
    1-element arrays that NumPy >= 2.4 refuses to convert to an int."""
    return end if _interpreting() else 0


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


@lru_cache(maxsize=256)
def _segments_on(device: torch.device, key_lengths: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(starts int32, lengths int32, lengths fp32) on ``device``; cached, since a handful
    of layouts repeat over every layer and step (and a host-to-device copy can stall)."""
    starts = [0]
    for length in key_lengths[:-1]:
        starts.append(starts[-1] + length)
    lengths = torch.tensor(key_lengths, dtype=torch.int32)
    return (
        torch.tensor(starts, dtype=torch.int32).to(device),
        lengths.to(device),
        lengths.float().to(device),
    )


def frame_softmax_partials(
    q: torch.Tensor,
    k: torch.Tensor,
    frame_seq_length: int,
    num_k: int,
    scale: float,
    config: dict | None = None,
    key_lengths: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel 1. (m, l, u, sums), each [H, Lq, num_k] fp32: per query and key frame, the
    max base-2 scaled score t, sum 2^(t - m), sum 2^(t - m) (m - t), and sum of raw q.k.

    Key frame f is the segment of ``key_lengths[f]`` tokens of k after the previous ones
    (default: ``num_k`` segments of ``frame_seq_length``)."""
    q, k = _unit_stride(q), _unit_stride(k)
    if key_lengths is None:
        key_lengths = (frame_seq_length,) * num_k
    starts, lengths, _ = _segments_on(q.device, tuple(int(n) for n in key_lengths))
    heads, num_queries, _ = q.shape
    m = torch.empty(heads, num_queries, num_k, dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    u = torch.empty_like(m)
    sums = torch.empty_like(m)
    config, launch = _launch_config(config, DEFAULT_CONFIG)
    grid = (math.ceil(num_queries / config["BLOCK_M"]), heads, num_k)
    _frame_softmax_partials[grid](
        q, k, starts, lengths, m, l, u, sums,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        num_queries, num_k, scale * LOG2E,
        **{**_constants(q), "LOOP_END": _interpreter_loop_end(max(key_lengths)), **config}, **launch,
    )  # fmt: skip
    return m, l, u, sums


def token_profile_sums(
    q: torch.Tensor,
    k: torch.Tensor,
    row_max: torch.Tensor,
    row_inv_sum: torch.Tensor,
    scale: float,
    config: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel 2. (prob_sums, logit_means), each [H, Lk] fp32: the sum over every query i
    of p_ij = 2^(t_ij - M_i) / L_i, given ``row_max`` = M and ``row_inv_sum`` = 1/L, each
    [H, Lq] fp32 (from kernel 1); and (mean_i q_i) . k_j * scale."""
    q, k = _unit_stride(q), _unit_stride(k)
    heads, num_queries, head_dim = q.shape
    num_keys = k.shape[1]
    row_max, row_inv_sum = row_max.contiguous(), row_inv_sum.contiguous()
    q_mean = token_mean(q, torch.float32).contiguous()  # [H, D], no whole fp32 copy of q
    prob_sums = torch.empty(heads, num_keys, dtype=torch.float32, device=q.device)
    logit_means = torch.empty_like(prob_sums)
    config, launch = _launch_config(config, DEFAULT_PROFILE_CONFIG)
    grid = (math.ceil(num_keys / config["BLOCK_N"]), heads)
    _token_profiles[grid](
        q, k, row_max, row_inv_sum, q_mean, prob_sums, logit_means,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        num_queries, num_keys, scale * LOG2E,
        **{**_constants(q), "LOOP_END": _interpreter_loop_end(num_queries), **config}, **launch,
    )  # fmt: skip
    return prob_sums, logit_means.mul_(scale)


def _combine(
    q: torch.Tensor,
    k: torch.Tensor,
    m: torch.Tensor,
    l: torch.Tensor,
    u: torch.Tensor,
    logit_mean: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    scale: float,
    token_profiles: bool,
    profile_config: dict | None,
) -> CallStatistics:
    """Every statistic from the per-frame partials (m, l, u) of kernel 1 or 3, each
    [H, Lq, num_k]; kernel 2 for the token profiles."""
    heads, num_queries, num_k = m.shape
    per_frame = (heads, num_q, frame_seq_length)
    row_max = m.amax(dim=-1, keepdim=True)  # M_i, [H, Lq, 1]
    rescale = torch.exp2(m - row_max)
    weights = l * rescale
    row_sum = weights.sum(dim=-1, keepdim=True)  # L_i >= 1
    prob_mass = (weights / row_sum).view(*per_frame, num_k).mean(dim=2)
    below_max = (rescale * (u + (row_max - m) * l)).sum(dim=-1, keepdim=True)  # sum_j 2^(t-M) (M - t)
    entropy_tok = torch.log(row_sum) + LN2 * below_max / row_sum
    entropy = entropy_tok.view(per_frame).mean(dim=2)
    argmax_share = one_hot_float(m.argmax(dim=-1), num_k, torch.float32).view(*per_frame, num_k).mean(dim=2)
    stats = CallStatistics(logit_mean=logit_mean, prob_mass=prob_mass, argmax_share=argmax_share, entropy=entropy)
    if token_profiles:
        prob_sums, stats.token_logit_mean = token_profile_sums(q, k, row_max[..., 0], 1.0 / row_sum[..., 0], scale, profile_config)
        stats.token_prob_mean = prob_sums.div_(num_queries)
    return stats


def statistics_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    key_lengths: Sequence[int],
    scale: float,
    *,
    token_profiles: bool = False,
    config: dict | None = None,
    profile_config: dict | None = None,
) -> CallStatistics:
    """Every statistic of :class:`CallStatistics`: kernel 1, then (only for token
    profiles) kernel 2, and torch for the combine, all on q's device."""
    key_lengths = tuple(int(n) for n in key_lengths)
    num_k = len(key_lengths)
    heads = q.shape[0]
    m, l, u, sums = frame_softmax_partials(q, k, frame_seq_length, num_k, scale, config, key_lengths)
    _, _, lengths = _segments_on(q.device, key_lengths)
    logit_mean = sums.view(heads, num_q, frame_seq_length, num_k).sum(dim=2) * scale / (frame_seq_length * lengths)
    return _combine(q, k, m, l, u, logit_mean, frame_seq_length, num_q, scale, token_profiles, profile_config)


def _logit_mean_by_factorization(
    q: torch.Tensor, key_sums: torch.Tensor, num_q: int, frame_seq_length: int, key_lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """[H, num_q, num_k]: (mean q of the query frame) . (mean k of the key frame) * scale,
    from the kernels' per-frame key sums [H, num_k, D] and their lengths (fp32)."""
    query_means = q.unflatten(1, (num_q, frame_seq_length)).sum(dim=2, dtype=torch.float32).div_(frame_seq_length)
    return torch.einsum("hqd,hkd->hqk", query_means, key_sums).mul_(scale / key_lengths)


def attention_statistics_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    key_lengths: Sequence[int],
    scale: float,
    *,
    token_profiles: bool = False,
    config: dict | None = None,
    profile_config: dict | None = None,
) -> tuple[torch.Tensor, CallStatistics]:
    """The attention output, [Lq, H, D] in q's dtype, and every statistic: kernel 3 (one
    pass over the keys for both; ``_combine_fused``), kernel 2 only for token profiles. q, k, v are [H, L, D]
    (any strides with unit stride last). logit_mean by factorization: (mean of the query
    frame's q) . (mean of the key frame's k) * scale, the key sums taken by kernel 3."""
    key_lengths = tuple(int(n) for n in key_lengths)
    num_k = len(key_lengths)
    q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
    heads, num_queries, head_dim = q.shape
    starts, lengths, lengths_float = _segments_on(q.device, key_lengths)
    m, g, l, w = torch.empty(4, heads, num_queries, num_k, dtype=torch.float32, device=q.device).unbind(0)
    key_sums = torch.empty(heads, num_k, head_dim, dtype=torch.float32, device=q.device)
    out = torch.empty(num_queries, heads, head_dim, dtype=q.dtype, device=q.device)
    config, launch = _launch_config(config, DEFAULT_FUSED_CONFIG)
    grid = (math.ceil(num_queries / config["BLOCK_M"]), heads)
    _attention_frame_partials[grid](
        q, k, v, out, starts, lengths, m, g, l, w, key_sums,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(1), out.stride(0),
        num_queries, num_k, scale * LOG2E,
        **{**_constants(q), "LOOP_END": _interpreter_loop_end(max(key_lengths)), "FRAMES_END": _interpreter_loop_end(num_k),
           **config}, **launch,
    )  # fmt: skip
    logit_mean = _logit_mean_by_factorization(q, key_sums, num_q, frame_seq_length, lengths_float, scale)
    return out, _combine_fused(q, k, m, g, l, w, logit_mean, frame_seq_length, num_q, scale, token_profiles, profile_config)


def _combine_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    m: torch.Tensor,
    g: torch.Tensor,
    l: torch.Tensor,
    w: torch.Tensor,
    logit_mean: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    scale: float,
    token_profiles: bool,
    profile_config: dict | None,
) -> CallStatistics:
    """Every statistic from kernel 3's partials, each [H, Lq, num_k]: per frame its max m,
    the running max g its sums l = sum 2^(t - g) and w = sum 2^(t - g) t refer to. With
    M = max_f g_f (the row's max), L = sum_f l_f 2^(g_f - M): mass_f = l_f 2^(g_f - M) / L;
    entropy (nats) = ln 2 (M + log2 L - sum_f w_f 2^(g_f - M) / L)."""
    heads, num_queries, num_k = m.shape
    per_frame = (heads, num_q, frame_seq_length)
    row_max = g.amax(dim=-1, keepdim=True)
    rescale = torch.exp2(g - row_max)
    weights = l * rescale
    row_sum = weights.sum(dim=-1, keepdim=True)
    prob_mass = (weights / row_sum).view(*per_frame, num_k).mean(dim=2)
    expected_t = (w * rescale).sum(dim=-1, keepdim=True) / row_sum
    entropy_tok = LN2 * (row_max + torch.log2(row_sum) - expected_t)
    entropy = entropy_tok.view(per_frame).mean(dim=2)
    argmax_share = one_hot_float(m.argmax(dim=-1), num_k, torch.float32).view(*per_frame, num_k).mean(dim=2)
    stats = CallStatistics(logit_mean=logit_mean, prob_mass=prob_mass, argmax_share=argmax_share, entropy=entropy)
    if token_profiles:
        prob_sums, stats.token_logit_mean = token_profile_sums(q, k, row_max[..., 0], 1.0 / row_sum[..., 0], scale, profile_config)
        stats.token_prob_mean = prob_sums.div_(num_queries)
    return stats


def sdpa_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [Lq, H, D], natural-log log-sum-exp [H, Lq] fp32) of one attention call, from
    cuDNN's attention (the backend SDPA picks on Hopper), or flash attention where cuDNN
    is not available. q, k, v are [H, L, D]."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        # cuDNN's op takes float32 without complaint and returns NaN (H100, torch 2.11).
        raise NotImplementedError(f"cuDNN and flash attention compute in fp16 / bf16, not {q.dtype}")
    q4, k4, v4 = q[None], k[None], v[None]
    errors = []
    for attend in (
        lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(q4, k4, v4, None, True, 0.0, False, False, scale=scale),
        lambda: torch.ops.aten._scaled_dot_product_flash_attention(q4, k4, v4, 0.0, False, False, scale=scale),
    ):
        try:
            out, lse = attend()[:2]
        except (RuntimeError, AttributeError) as error:  # not built, or not for this dtype / head_dim
            errors.append(str(error).splitlines()[0][:120])
            continue
        return out[0].transpose(0, 1), lse.reshape(q.shape[0], q.shape[1]).float()
    raise NotImplementedError(f"no attention backend returns the log-sum-exp here ({'; '.join(errors)})")


def attention_statistics_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    key_lengths: Sequence[int],
    scale: float,
    *,
    token_profiles: bool = False,
    config: dict | None = None,
    profile_config: dict | None = None,
) -> tuple[torch.Tensor, CallStatistics]:
    """The attention call by cuDNN (its output and log-sum-exp), then kernel 4 for the
    frame statistics: a second pass over the keys, without kernel 1's running max."""
    out, lse = sdpa_with_lse(q, k, v, scale)
    stats = statistics_given_lse(q, k, lse, frame_seq_length, num_q, key_lengths, scale, token_profiles=token_profiles,
                                 config=config, profile_config=profile_config)  # fmt: skip
    return out, stats


def statistics_given_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    key_lengths: Sequence[int],
    scale: float,
    *,
    token_profiles: bool = False,
    config: dict | None = None,
    profile_config: dict | None = None,
) -> CallStatistics:
    """Every statistic, given each query's natural-log log-sum-exp of q.k * scale over
    all keys (``lse``, [H, Lq] fp32): kernel 4, kernel 2 for token profiles, a combine."""
    key_lengths = tuple(int(n) for n in key_lengths)
    num_k = len(key_lengths)
    q, k = _unit_stride(q), _unit_stride(k)
    heads, num_queries, head_dim = q.shape
    starts, lengths, lengths_float = _segments_on(q.device, key_lengths)
    lse2 = (lse * LOG2E).contiguous()
    m, l, w = torch.empty(3, heads, num_queries, num_k, dtype=torch.float32, device=q.device).unbind(0)
    key_sums = torch.empty(heads, num_k, head_dim, dtype=torch.float32, device=q.device)
    config, launch = _launch_config(config, DEFAULT_LSE_CONFIG)
    grid = (math.ceil(num_queries / config["BLOCK_M"]), heads, num_k)
    _frame_partials_given_lse[grid](
        q, k, lse2, starts, lengths, m, l, w, key_sums,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        num_queries, num_k, scale * LOG2E,
        **{**_constants(q), "LOOP_END": _interpreter_loop_end(max(key_lengths)), **config}, **launch,
    )  # fmt: skip
    logit_mean = _logit_mean_by_factorization(q, key_sums, num_q, frame_seq_length, lengths_float, scale)
    per_frame = (heads, num_q, frame_seq_length)
    prob_mass = l.view(*per_frame, num_k).mean(dim=2)
    entropy = (LN2 * (lse2 - w.sum(dim=-1))).view(per_frame).mean(dim=2)
    argmax_share = one_hot_float(m.argmax(dim=-1), num_k, torch.float32).view(*per_frame, num_k).mean(dim=2)
    stats = CallStatistics(logit_mean=logit_mean, prob_mass=prob_mass, argmax_share=argmax_share, entropy=entropy)
    if token_profiles:
        prob_sums, stats.token_logit_mean = token_profile_sums(q, k, lse2, torch.ones_like(lse2), scale, profile_config)
        stats.token_prob_mean = prob_sums.div_(num_queries)
    return stats

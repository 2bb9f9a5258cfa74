"""The Triton kernels of the call statistics (device code), streaming passes whose scores
are never stored; ``sinkscope.stats.launch`` launches them and combines their partials.

``frame_softmax_partials_kernel``: each program owns BLOCK_M queries of one
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

``token_profiles_kernel`` (only for token profiles): a second streaming pass
that reuses each query's base-2 log-sum-exp (from the combine, or cuDNN's). Its grid is
(key tiles of BLOCK_N, heads); each program holds its key tile and loops over all query blocks,
computing p = 2^(t - lse2) and accumulating it elementwise in a [BLOCK_M, BLOCK_N]
register tile, reduced over the queries once at the end. It writes [H, Lk] column sums:
O(keys) memory, and one more QK^T over the call, so it costs about what
``frame_softmax_partials_kernel`` does.
It is a separate pass because the column sums need every query's final normalizer,
which only exists once every key has been seen. The same program also writes each
key's mean logit (mean_i q_i) . k_j from its tile (exact by factorization, in fp32,
with no fp32 copy of q or k).

Splitting ``frame_softmax_partials_kernel``'s grid by key frame gives 3 x 12 x ceil(Lq / BLOCK_M) independent
programs even for the first block, needs no per-frame accumulators in registers, and
works for any number of key frames (sliding windows, sinks, long videos).

``frame_partials_given_lse_kernel`` is the same pass when the attention call already gave
each query's log-sum-exp (cuDNN's): no running max, no rescaling.

``attention_frame_partials_kernel`` computes the attention output too (the captured layer's
own attention) in the same pass, with pointer loads and a tile grid per frame; its form with
TMA tensor descriptors and key tiles aligned to key 0 is
``sinkscope.stats.tma_kernels.attention_frame_partials_tma_kernel``. The reductions that
touch no score (``frame_statistics_combine_kernel``, the combine of their partials;
``segment_sums_kernel``, the per-frame sums of q or k) are in
``sinkscope.stats.reduction_kernels``. docs/performance.md has the measurements.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_rows(base, stride_row, offs_row, row_valid, offs_d, d_valid):
    """A [rows, D_PAD] tile of a [L, D] matrix (one head's q); padding reads 0."""
    return tl.load(
        base + offs_row[:, None] * stride_row + offs_d[None, :], mask=row_valid[:, None] & d_valid[None, :], other=0.0
    )


@triton.jit
def frame_softmax_partials_kernel(
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
    # In Triton's interpreter (LOOP_END > 0, see launch_support._interpreter_loop_end) every program runs
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
    """One key tile of ``attention_frame_partials_kernel`` (inlined). Unmasked tiles skip every per-score select."""
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
def attention_frame_partials_kernel(
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
    """The attention output and every frame statistic's partials in one pass.

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
    # LOOP_END / FRAMES_END > 0 in Triton's interpreter only (see launch_support._interpreter_loop_end):
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
                    True,
                    D_PAD == HEAD_DIM,
                    IEEE,
                    BLOCK_N,
                )
        else:
            whole = (seg_len // BLOCK_N) * BLOCK_N
            for start in range(0, whole, BLOCK_N):
                acc, g_i, big_l, m_f, l_f, w_f, key_sum = _fused_tile(
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
                    False,
                    D_PAD == HEAD_DIM,
                    IEEE,
                    BLOCK_N,
                )
            if whole < seg_len:
                acc, g_i, big_l, m_f, l_f, w_f, key_sum = _fused_tile(
                    q,
                    k_seg,
                    v_seg,
                    whole,
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
                    True,
                    D_PAD == HEAD_DIM,
                    IEEE,
                    BLOCK_N,
                )
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
    """One key tile of ``frame_partials_given_lse_kernel`` (inlined). Per score: one multiply-add into the exponent
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
def frame_partials_given_lse_kernel(
    q_ptr,
    k_ptr,
    lse_ptr,
    bias_ptr,
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
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """``frame_softmax_partials_kernel``'s pass when the attention call already gave each query's
    log-sum-exp (``lse_ptr``: base 2, of t = q.k * scale * log2 e, [H, Lq]). Then
    p = 2^(t - lse) is final: no running max, no rescaling. Per (query, key frame) it
    stores the frame's max t (argmax_share), sum p (prob_mass) and sum p t (entropy).

    HAS_BIAS (an edited call, ``sinkscope.attention.biased``): ``bias_ptr`` [H, num key
    frames] holds base-2 biases b, added to every t of that head and frame, and ``lse_ptr``
    is the edited softmax's. b is constant over the program, so it goes into the exponent's
    offset (p = 2^(t + b - lse)) and onto m (+ b) and w (+ b sum p) at the end. A masked
    frame (b = -inf) gets p = 0, m = -inf and w = 0 (not -inf * 0); only the first query
    block reads its keys, for their sums (logit_mean stays the raw score's)."""
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
    if HAS_BIAS:
        bias = tl.load(bias_ptr + head * num_key_frames + frame)
        neg_lse += bias
        # The tokens this program reads: none of a masked frame, but in the first query block.
        run_len = tl.where((bias == float("-inf")) & (pid_m != 0), 0, seg_len)
    else:
        run_len = seg_len
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    w_i = tl.zeros([BLOCK_M], tl.float32)
    key_sum = tl.zeros([D_PAD], tl.float32)
    k_seg = k_ptr + head * stride_kh + seg_start * stride_kl
    # LOOP_END > 0 in Triton's interpreter only (see launch_support._interpreter_loop_end): there every
    # tile is masked and the loop runs to a compile-time bound.
    if LOOP_END > 0:
        for start in range(0, LOOP_END, BLOCK_N):
            m_i, l_i, w_i, key_sum = _lse_tile(
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
                True,
                D_PAD == HEAD_DIM,
                IEEE,
                BLOCK_N,
            )
    else:
        whole = (run_len // BLOCK_N) * BLOCK_N
        for start in range(0, whole, BLOCK_N):
            m_i, l_i, w_i, key_sum = _lse_tile(
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
                False,
                D_PAD == HEAD_DIM,
                IEEE,
                BLOCK_N,
            )
        if whole < run_len:
            m_i, l_i, w_i, key_sum = _lse_tile(
                q,
                k_seg,
                whole,
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
                True,
                D_PAD == HEAD_DIM,
                IEEE,
                BLOCK_N,
            )
    out = (head * num_queries + offs_m) * num_key_frames + frame
    m_out = m_i * qk_scale_log2
    w_out = w_i * qk_scale_log2
    if HAS_BIAS:
        m_out += bias
        w_out += tl.where(l_i > 0.0, bias, 0.0) * l_i
    tl.store(m_ptr + out, m_out, mask=m_valid)
    tl.store(l_ptr + out, l_i, mask=m_valid)
    tl.store(w_ptr + out, w_out, mask=m_valid)
    if sum_keys:
        tl.store(key_sum_ptr + (head * num_key_frames + frame) * HEAD_DIM + offs_d, key_sum, mask=d_valid)


@triton.jit
def token_profiles_kernel(
    q_ptr,
    k_ptr,
    lse2_ptr,
    bias_ptr,
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
    scale,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    IEEE: tl.constexpr,
    LOOP_END: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # HAS_BIAS (an edited call): ``bias_ptr`` [H, Lk] holds each key token's base-2 bias
    # (-inf: masked, p = 0) and ``lse2_ptr`` the edited softmax's log-sum-exp; the mean
    # logits stay the raw scores'.
    # The key tile in two halves: two independent products and exponentials a step, which
    # the scheduler interleaves (faster: docs/performance-history.md).
    HALF: tl.constexpr = BLOCK_N // 2
    pid_n = tl.program_id(0)
    head = tl.program_id(1)
    offs_a = pid_n * BLOCK_N + tl.arange(0, HALF)
    offs_b = offs_a + HALF
    offs_d = tl.arange(0, D_PAD)
    if D_PAD == HEAD_DIM:
        d_valid = tl.full([D_PAD], 1, tl.int1)  # no padding: masks by row only, loads vectorize
    else:
        d_valid = offs_d < HEAD_DIM
    k_base = k_ptr + head * stride_kh + offs_d[:, None]
    k_a = tl.load(k_base + offs_a[None, :] * stride_kl, mask=(offs_a < num_keys)[None, :] & d_valid[:, None], other=0.0)
    k_b = tl.load(k_base + offs_b[None, :] * stride_kl, mask=(offs_b < num_keys)[None, :] & d_valid[:, None], other=0.0)
    acc_a = tl.zeros([BLOCK_M, HALF], tl.float32)
    acc_b = tl.zeros([BLOCK_M, HALF], tl.float32)
    if HAS_BIAS:
        bias_a = tl.load(bias_ptr + head * num_keys + offs_a, mask=offs_a < num_keys, other=0.0)
        bias_b = tl.load(bias_ptr + head * num_keys + offs_b, mask=offs_b < num_keys, other=0.0)
    # LOOP_END > 0 in Triton's interpreter only (see launch_support._interpreter_loop_end).
    for start in range(0, LOOP_END if LOOP_END > 0 else num_queries, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        m_valid = offs_m < num_queries
        q = _load_rows(q_ptr + head * stride_qh, stride_ql, offs_m, m_valid, offs_d, d_valid)
        # Rows past the end read a log-sum-exp of +inf: their p is exactly 0.
        lse2 = tl.load(lse2_ptr + head * num_queries + offs_m, mask=m_valid, other=float("inf"))
        if IEEE:
            s_a = tl.dot(q, k_a, input_precision="ieee")
            s_b = tl.dot(q, k_b, input_precision="ieee")
        else:
            s_a = tl.dot(q, k_a)
            s_b = tl.dot(q, k_b)
        # Columns past the end are never stored, so they need no mask here.
        if HAS_BIAS:
            acc_a += tl.exp2(s_a * qk_scale_log2 + bias_a[None, :] - lse2[:, None])
            acc_b += tl.exp2(s_b * qk_scale_log2 + bias_b[None, :] - lse2[:, None])
        else:
            acc_a += tl.exp2(s_a * qk_scale_log2 - lse2[:, None])
            acc_b += tl.exp2(s_b * qk_scale_log2 - lse2[:, None])
    tl.store(prob_ptr + head * num_keys + offs_a, tl.sum(acc_a, 0), mask=offs_a < num_keys)
    tl.store(prob_ptr + head * num_keys + offs_b, tl.sum(acc_b, 0), mask=offs_b < num_keys)
    # The mean score of each key over every query, (mean_i q_i) . k_j * scale in fp32, after the
    # loop: k read again (from L2) keeps its fp32 copy out of the loop's registers.
    q_mean = tl.load(q_mean_ptr + head * HEAD_DIM + offs_d, mask=d_valid, other=0.0) * scale
    _store_key_logits(k_base, stride_kl, offs_a, num_keys, d_valid, q_mean, logit_ptr + head * num_keys)
    _store_key_logits(k_base, stride_kl, offs_b, num_keys, d_valid, q_mean, logit_ptr + head * num_keys)


@triton.jit
def _store_key_logits(k_base, stride_kl, offs, num_keys, d_valid, q_mean, out_ptr):
    """q_mean . k_j in fp32 for the keys ``offs`` of one head."""
    valid = offs < num_keys
    k_tile = tl.load(k_base + offs[None, :] * stride_kl, mask=valid[None, :] & d_valid[:, None], other=0.0)
    tl.store(out_ptr + offs, tl.sum(k_tile.to(tl.float32) * q_mean[:, None], 0), mask=valid)

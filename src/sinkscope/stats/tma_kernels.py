"""The one pass of the `fused` route fed by TMA (device code; ``sinkscope.stats.launch``'s
``tma_attention`` launches it): ``attention_frame_partials_tma_kernel`` computes the attention
output and every key frame's partials (m, g, l, w: the maths of
``sinkscope.stats.kernels``'s one-pass kernels) with TMA tensor descriptors and key tiles
aligned to key 0, so that only a frame's last tile needs a mask; a frame that ends inside a tile
is closed there (``_frame_split_update``). docs/performance.md has the measured tiles.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _frame_split_update(t, t_finite, p, in_frame, m_f, l_f, w_f, alpha):
    """At a frame's last tile: the tile's part in the ending frame (``in_frame``) closes it,
    the rest opens the next. Returns (closed m, l, w) and (opened m, l, w). ``t_finite`` is
    t with the padding keys' -inf as 0 (their p is 0), for the sums of p t."""
    closed_m = tl.maximum(m_f, tl.max(tl.where(in_frame, t, float("-inf")), 1))
    closed_l = l_f * alpha + tl.sum(tl.where(in_frame, p, 0.0), 1)
    closed_w = w_f * alpha + tl.sum(tl.where(in_frame, p * t_finite, 0.0), 1)
    opened_m = tl.max(tl.where(in_frame, float("-inf"), t), 1)
    opened_l = tl.sum(tl.where(in_frame, 0.0, p), 1)
    opened_w = tl.sum(tl.where(in_frame, 0.0, p * t_finite), 1)
    return closed_m, closed_l, closed_w, opened_m, opened_l, opened_w


@triton.jit
def _tma_tile(q, k, v, valid, acc, g_i, big_l, qk_scale_log2, MASKED: tl.constexpr):
    """Flash attention's update by one key tile (k, v: [BLOCK_N, D]); returns the tile's
    base-2 scores t (-inf where not ``valid`` when MASKED), p = 2^(t - g), the tile's row
    max and the rescale alpha, with the updated (acc, g, L)."""
    t = tl.dot(q, k.T) * qk_scale_log2
    if MASKED:  # keys past the end read as zeros (TMA's padding)
        t = tl.where(valid[None, :], t, float("-inf"))
    tile_max = tl.max(t, 1)
    g_new = tl.maximum(g_i, tile_max)
    alpha = tl.exp2(g_i - g_new)
    p = tl.exp2(t - g_new[:, None])
    big_l = big_l * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return t, p, tile_max, alpha, acc, g_new, big_l


@triton.jit
def attention_frame_partials_tma_kernel(
    q_desc,
    k_desc,
    v_desc,
    o_ptr,
    frame_ends_ptr,
    m_ptr,
    g_ptr,
    l_ptr,
    w_ptr,
    stride_oh,
    stride_ol,
    num_queries,
    num_keys,
    num_key_frames,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    STATS: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    LOOP_END: tl.constexpr,
    FRAMES_END: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """``attention_frame_partials_kernel``'s one pass (the attention output and every frame's partials) with
    q, k, v read through tensor descriptors ([H, L, D]; TMA on Hopper) and key tiles on a
    grid aligned to key 0, not to each frame. Frames are contiguous in k, each at least
    BLOCK_N keys (``frame_ends_ptr``: each frame's end). Per frame, the tiles wholly inside
    it run in a loop with no mask and no branch (two row sums, p and p t, and the row max
    on top of flash attention's work); the tile that holds the frame's end, if it does not
    fall on a tile edge, splits its sums between the closing frame and the next one. With
    STATS False it is a plain flash-attention forward (for measurements; pass one frame)."""
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_valid = offs_m < num_queries
    q = q_desc.load([head, pid_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
    g_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    big_l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m_f = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_f = tl.zeros([BLOCK_M], tl.float32)
    w_f = tl.zeros([BLOCK_M], tl.float32)
    out = (head * num_queries + offs_m) * num_key_frames
    frame_start = tl.full([], 0, tl.int32)
    # LOOP_END / FRAMES_END > 0 in Triton's interpreter only (see launch_support._interpreter_loop_end):
    # there each loop runs from 0 to a compile-time bound, the tiles outside it masked.
    for frame in range(0, FRAMES_END if FRAMES_END > 0 else num_key_frames):
        frame_end = tl.load(frame_ends_ptr + frame)
        first = tl.cdiv(frame_start, BLOCK_N) * BLOCK_N
        last = (frame_end // BLOCK_N) * BLOCK_N  # the tiles wholly inside: [first, last)
        for start in tl.range(
            first if LOOP_END == 0 else 0, last if LOOP_END == 0 else LOOP_END, BLOCK_N, warp_specialize=WARP_SPECIALIZE
        ):
            offs_n = start + tl.arange(0, BLOCK_N)
            k = k_desc.load([head, start, 0]).reshape(BLOCK_N, HEAD_DIM)
            v = v_desc.load([head, start, 0]).reshape(BLOCK_N, HEAD_DIM)
            inside = (offs_n >= first) & (offs_n < last)
            t, p, tile_max, alpha, acc, g_i, big_l = _tma_tile(
                q, k, v, inside, acc, g_i, big_l, qk_scale_log2, LOOP_END > 0
            )
            if LOOP_END > 0:
                t = tl.where(inside[None, :], t, 0.0)
            if STATS:
                m_f = tl.maximum(m_f, tile_max)
                l_f = l_f * alpha + tl.sum(p, 1)
                w_f = w_f * alpha + tl.sum(p * t, 1)
        closed_m, closed_l, closed_w = m_f, l_f, w_f
        m_f = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_f = tl.zeros([BLOCK_M], tl.float32)
        w_f = tl.zeros([BLOCK_M], tl.float32)
        if last < frame_end:  # the tile [last, last + BLOCK_N) holds this frame's end
            offs_n = last + tl.arange(0, BLOCK_N)
            k = k_desc.load([head, last, 0]).reshape(BLOCK_N, HEAD_DIM)
            v = v_desc.load([head, last, 0]).reshape(BLOCK_N, HEAD_DIM)
            t, p, tile_max, alpha, acc, g_i, big_l = _tma_tile(
                q, k, v, offs_n < num_keys, acc, g_i, big_l, qk_scale_log2, True
            )
            if STATS:
                in_frame = (offs_n < frame_end)[None, :]
                t_finite = tl.where(t == float("-inf"), 0.0, t)
                closed_m, closed_l, closed_w, m_f, l_f, w_f = _frame_split_update(
                    t, t_finite, p, in_frame, closed_m, closed_l, closed_w, alpha
                )
        if STATS:
            tl.store(m_ptr + out + frame, closed_m, mask=m_valid)
            tl.store(g_ptr + out + frame, g_i, mask=m_valid)
            tl.store(l_ptr + out + frame, closed_l, mask=m_valid)
            tl.store(w_ptr + out + frame, closed_w, mask=m_valid)
        frame_start = frame_end
    o = acc / big_l[:, None]
    tl.store(
        o_ptr + head * stride_oh + offs_m[:, None] * stride_ol + tl.arange(0, HEAD_DIM)[None, :],
        o.to(o_ptr.dtype.element_ty),
        mask=m_valid[:, None],
    )

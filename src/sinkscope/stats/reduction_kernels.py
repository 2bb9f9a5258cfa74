"""The Triton reductions of the call statistics that touch no attention score (device
code; ``sinkscope.stats.launch`` launches them).

``frame_statistics_combine_kernel``: every frame statistic (prob_mass, argmax_share,
entropy, each query's log-sum-exp) from the per-frame partials of
``attention_frame_partials_kernel``, its TMA form (``sinkscope.stats.kernels``) or
FlashAttention-4's one pass, in fixed row partitions, with each partition's sum of q;
``frame_statistics_finish_kernel`` adds the partitions in a fixed order (so the result is
deterministic) and takes logit_mean from the query and key frames' sums: two launches in all.

``segment_sums_kernel``: the fp32 sum of each frame's tokens of q or k, which logit_mean's
factorization needs (the key frames' after the TMA pass, the query frames' after
``frame_partials_given_lse_kernel``, all queries' for ``token_profiles_kernel``), each
frame split in parts so that a few long frames still fill the GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def frame_statistics_combine_kernel(
    m_ptr,
    g_ptr,
    l_ptr,
    w_ptr,
    q_ptr,
    mass_ptr,
    argmax_ptr,
    entropy_ptr,
    query_sums_ptr,
    lse_ptr,
    stride_qh,
    stride_ql,
    stride_ph,
    stride_pl,
    stride_pf,
    frame_seq_length,
    num_query_frames,
    num_queries,
    num_key_frames,
    HEAD_DIM: tl.constexpr,
    D_CHUNK: tl.constexpr,
    F_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Every frame statistic but logit_mean from the one pass's partials, each [H, Lq, F] fp32
    with strides (``stride_ph``, ``stride_pl``, ``stride_pf``), the four alike (per query and
    key frame: the frame's max m, the running max g that its l = sum 2^(t - g) and w = sum
    2^(t - g) t refer to). Per query, with G = max_f g_f and L = sum_f l_f 2^(g_f - G):
    mass_f = l_f 2^(g_f - G) / L, entropy = ln 2 (G + log2 L - sum_f w_f 2^(g_f - G) / L), the
    argmax frame = the lowest f of the largest m_f. Program (query frame, head, part) takes
    BLOCK_M of the frame's queries and stores their sums (``frame_statistics_finish_kernel``
    adds the parts in a fixed order, so the result is deterministic), their sum of q ([H, Lq,
    D], unit stride last: logit_mean's factorization) and each query's base-2 log-sum-exp
    G + log2 L (for ``token_profiles_kernel``). Outputs [parts, H, num_q, F] (mass, argmax),
    [parts, H, num_q] (entropy) and [parts, H, num_q, D] (the sums of q)."""
    query_frame = tl.program_id(0)
    head = tl.program_id(1)
    part = tl.program_id(2)
    offs_f = tl.arange(0, F_PAD)
    f_valid = offs_f < num_key_frames
    local = part * BLOCK_M + tl.arange(0, BLOCK_M)
    r_valid = local < frame_seq_length
    queries = query_frame * frame_seq_length + local
    rows = head * num_queries + queries
    index = head * stride_ph + queries[:, None] * stride_pl + offs_f[None, :] * stride_pf
    valid = r_valid[:, None] & f_valid[None, :]
    m = tl.load(m_ptr + index, mask=valid, other=float("-inf"))
    g = tl.load(g_ptr + index, mask=valid, other=float("-inf"))
    exp_sum = tl.load(l_ptr + index, mask=valid, other=0.0)
    w = tl.load(w_ptr + index, mask=valid, other=0.0)
    program = (part * tl.num_programs(1) + head) * num_query_frames + query_frame
    # The sum of q first: its loads do not wait for the statistics' arithmetic.
    for d0 in tl.static_range(0, HEAD_DIM, D_CHUNK):
        offs_d = d0 + tl.arange(0, D_CHUNK)
        d_valid = offs_d < HEAD_DIM
        q = tl.load(
            q_ptr + head * stride_qh + queries[:, None] * stride_ql + offs_d[None, :],
            mask=r_valid[:, None] & d_valid[None, :],
            other=0.0,
        ).to(tl.float32)
        tl.store(query_sums_ptr + program * HEAD_DIM + offs_d, tl.sum(q, 0), mask=d_valid)
    # Rows past the frame read g = -inf everywhere (NaN below); every sum drops them.
    row_max = tl.max(g, 1)
    rescale = tl.exp2(g - row_max[:, None])
    weights = exp_sum * rescale
    row_sum = tl.sum(weights, 1)
    mass = tl.sum(tl.where(valid, weights / row_sum[:, None], 0.0), 0)
    expected_t = tl.sum(tl.where(valid, w * rescale, 0.0), 1) / row_sum
    lse = row_max + tl.log2(row_sum)
    entropy = tl.sum(tl.where(r_valid, 0.6931471805599453 * (lse - expected_t), 0.0), 0)
    top = tl.argmax(m, 1, tie_break_left=True)
    argmax = tl.sum(tl.where(r_valid[:, None] & (offs_f[None, :] == top[:, None]), 1.0, 0.0), 0)
    tl.store(lse_ptr + rows, lse, mask=r_valid)
    tl.store(mass_ptr + program * num_key_frames + offs_f, mass, mask=f_valid)
    tl.store(argmax_ptr + program * num_key_frames + offs_f, argmax, mask=f_valid)
    tl.store(entropy_ptr + program, entropy)


@triton.jit
def frame_statistics_finish_kernel(
    mass_parts_ptr,
    argmax_parts_ptr,
    entropy_parts_ptr,
    query_sums_ptr,
    key_sums_ptr,
    key_lengths_ptr,
    mass_ptr,
    argmax_ptr,
    logit_ptr,
    entropy_ptr,
    frame_seq_length,
    num_query_frames,
    num_key_frames,
    scale,
    PARTS: tl.constexpr,
    PARTS_BLOCK: tl.constexpr,
    KEY_PARTS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_CHUNK: tl.constexpr,
    F_PAD: tl.constexpr,
):
    """``frame_statistics_combine_kernel``'s ``PARTS`` parts added in a fixed order
    (``PARTS_BLOCK`` at a time), divided by the frame's size: prob_mass, argmax_share, entropy;
    and logit_mean by factorization: the query frame's sum of q . each key frame's sum of k
    (``segment_sums_kernel``'s ``KEY_PARTS`` parts, [parts, H, F, D] fp32, added here) * scale
    / (frame_seq_length x the key frame's length, ``key_lengths_ptr`` fp32). Program (query
    frame, head); outputs [H, num_q, F] and [H, num_q]."""
    query_frame = tl.program_id(0)
    head = tl.program_id(1)
    heads = tl.num_programs(1)
    offs_f = tl.arange(0, F_PAD)
    f_valid = offs_f < num_key_frames
    # PARTS_BLOCK parts at a time ([parts, ...] tiles added by tl.sum): a fixed order, few
    # chains of loads, and tiles that stay in registers when there are many key frames.
    mass = tl.zeros([F_PAD], tl.float32)
    argmax = tl.zeros([F_PAD], tl.float32)
    entropy = 0.0
    for p0 in tl.static_range(0, PARTS, PARTS_BLOCK):
        offs_p = p0 + tl.arange(0, PARTS_BLOCK)
        p_valid = offs_p < PARTS
        programs = (offs_p * heads + head) * num_query_frames + query_frame
        index = programs[:, None] * num_key_frames + offs_f[None, :]
        valid = p_valid[:, None] & f_valid[None, :]
        mass += tl.sum(tl.load(mass_parts_ptr + index, mask=valid, other=0.0), 0)
        argmax += tl.sum(tl.load(argmax_parts_ptr + index, mask=valid, other=0.0), 0)
        entropy += tl.sum(tl.load(entropy_parts_ptr + programs, mask=p_valid, other=0.0), 0)
    logit = tl.zeros([F_PAD], tl.float32)
    for d0 in tl.static_range(0, HEAD_DIM, D_CHUNK):  # D in chunks: the [F, D] key sums stay small
        offs_d = d0 + tl.arange(0, D_CHUNK)
        d_valid = offs_d < HEAD_DIM
        query_sum = tl.zeros([D_CHUNK], tl.float32)
        for p0 in tl.static_range(0, PARTS, PARTS_BLOCK):
            offs_p = p0 + tl.arange(0, PARTS_BLOCK)
            p_valid = offs_p < PARTS
            programs = (offs_p * heads + head) * num_query_frames + query_frame
            query_sum += tl.sum(
                tl.load(
                    query_sums_ptr + programs[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=p_valid[:, None] & d_valid[None, :],
                    other=0.0,
                ),
                0,
            )
        key_sums = tl.zeros([F_PAD, D_CHUNK], tl.float32)
        for key_part in tl.static_range(KEY_PARTS):
            key_sums += tl.load(
                key_sums_ptr
                + ((key_part * heads + head) * num_key_frames + offs_f[:, None]) * HEAD_DIM
                + offs_d[None, :],
                mask=f_valid[:, None] & d_valid[None, :],
                other=0.0,
            )
        logit += tl.sum(key_sums * query_sum[None, :], 1)
    key_lengths = tl.load(key_lengths_ptr + offs_f, mask=f_valid, other=1.0)
    out = (head * num_query_frames + query_frame) * num_key_frames + offs_f
    tl.store(mass_ptr + out, mass / frame_seq_length, mask=f_valid)
    tl.store(argmax_ptr + out, argmax / frame_seq_length, mask=f_valid)
    tl.store(logit_ptr + out, logit * scale / (frame_seq_length * key_lengths), mask=f_valid)
    tl.store(entropy_ptr + head * num_query_frames + query_frame, entropy / frame_seq_length)


@triton.jit
def segment_sums_kernel(
    x_ptr,
    ends_ptr,
    out_ptr,
    stride_h,
    stride_l,
    num_segments,
    chunk,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    LOOP_END: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    """The fp32 sum of each segment of consecutive tokens of one head of x ([H, L, D],
    any strides, unit stride last; segment s ends at ``ends_ptr[s]``), without an fp32 copy
    of x: the key frames' sums and the query frames' sums that logit_mean's factorization
    needs. Program (segment, head, part) sums the part-th ``chunk`` tokens of its segment into
    out [parts, H, S, D], so that a few long segments (3 query frames of 1560 tokens) still
    fill the GPU; the caller adds the parts."""
    segment = tl.program_id(0)
    head = tl.program_id(1)
    part = tl.program_id(2)
    start = tl.load(ends_ptr + segment - 1, mask=segment > 0, other=0) + part * chunk
    stop = tl.minimum(tl.load(ends_ptr + segment), start + chunk)
    offs_d = tl.arange(0, D_PAD)
    d_valid = offs_d < HEAD_DIM
    acc = tl.zeros([BLOCK_L, D_PAD], tl.float32)
    # LOOP_END > 0 in Triton's interpreter only (see launch_support._interpreter_loop_end).
    for offset in range(0, LOOP_END if LOOP_END > 0 else stop - start, BLOCK_L):
        rows = start + offset + tl.arange(0, BLOCK_L)
        acc += tl.load(
            x_ptr + head * stride_h + rows[:, None] * stride_l + offs_d[None, :],
            mask=(rows < stop)[:, None] & d_valid[None, :],
            other=0.0,
        ).to(tl.float32)
    out = ((part * tl.num_programs(1) + head) * num_segments + segment) * HEAD_DIM
    tl.store(out_ptr + out + offs_d, tl.sum(acc, 0), mask=d_valid)


@triton.jit
def part_partials_merge_kernel(
    part_ptr,
    out_ptr,
    frame_ends_ptr,
    stride_pk,
    stride_pp,
    stride_ph,
    stride_pf,
    stride_ok,
    stride_oh,
    stride_of,
    num_parts,
    part_length,
    num_queries,
    PARTS_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    """A key split's parts' frame partials merged (``flash4_attention_partials``): part_ptr
    [4, parts, H, F, Lq] (m, g, l, w; queries at unit stride), out_ptr the same without the
    parts. A part reaches a frame where their keys meet (part p holds keys [p, p + 1) x
    ``part_length``); the others' entries are not read (never written). Per (frame, head,
    query): m the reaching parts' max, g the largest of their references, l and w moved to it
    (times 2^(g_p - g))."""
    frame = tl.program_id(0)
    head = tl.program_id(1)
    offs_q = tl.program_id(2) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    q_valid = offs_q < num_queries
    start = tl.load(frame_ends_ptr + frame - 1, mask=frame > 0, other=0)
    end = tl.load(frame_ends_ptr + frame)
    parts = tl.arange(0, PARTS_PAD)
    reaches = (parts < num_parts) & (start < (parts + 1) * part_length) & (end > parts * part_length)
    valid = reaches[:, None] & q_valid[None, :]
    index = parts[:, None] * stride_pp + head * stride_ph + frame * stride_pf + offs_q[None, :]
    m = tl.load(part_ptr + index, mask=valid, other=float("-inf"))
    g = tl.load(part_ptr + stride_pk + index, mask=valid, other=float("-inf"))
    exp_sum = tl.load(part_ptr + 2 * stride_pk + index, mask=valid, other=0.0)
    w = tl.load(part_ptr + 3 * stride_pk + index, mask=valid, other=0.0)
    reference = tl.max(g, 0)
    weight = tl.where(valid, tl.exp2(g - reference[None, :]), 0.0)
    out = head * stride_oh + frame * stride_of + offs_q
    tl.store(out_ptr + out, tl.max(m, 0), mask=q_valid)
    tl.store(out_ptr + stride_ok + out, reference, mask=q_valid)
    tl.store(out_ptr + 2 * stride_ok + out, tl.sum(exp_sum * weight, 0), mask=q_valid)
    tl.store(out_ptr + 3 * stride_ok + out, tl.sum(w * weight, 0), mask=q_valid)

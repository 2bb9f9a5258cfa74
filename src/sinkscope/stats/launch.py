"""Launching the statistics kernels over the scores and turning their partials into every
statistic of ``CallStatistics``: tile configurations, the combines, the cuDNN call that gives
the log-sum-exp.

The kernels (``sinkscope.stats.kernels``; the maths in its docstring):
``frame_softmax_partials_kernel`` (each key frame's softmax partials),
``token_profiles_kernel`` (per key token, given each query's log-sum-exp),
``attention_frame_partials_kernel`` (the attention output and the frame partials in one
pass), ``frame_partials_given_lse_kernel`` (the frame partials given the log-sum-exp),
and ``sinkscope.stats.tma_kernels``'s ``attention_frame_partials_tma_kernel`` (the one pass
fed by TMA). The reductions that touch no score (the per-frame sums of q or k, the one-pass
routes' combine) are launched by ``sinkscope.stats.reductions``; what the launchers share (the
interpreter's settings, key frames on the device) is ``sinkscope.stats.launch_support``.
docs/performance.md has the measured tiles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton

from sinkscope.attention.biased import check_bias_shape, token_bias
from sinkscope.attention.split import cached_attention
from sinkscope.stats.kernels import (
    attention_frame_partials_kernel,
    frame_partials_given_lse_kernel,
    frame_softmax_partials_kernel,
    token_profiles_kernel,
)
from sinkscope.stats.launch_support import (
    _frame_ends_on,
    _interpreter_loop_end,
    _launch_config,
    _segments_on,
    _unit_stride,
)
from sinkscope.stats.reductions import combine_frame_partials, segment_part_sums, segment_sums
from sinkscope.stats.reference import CallStatistics, one_hot_float
from sinkscope.stats.tma_kernels import attention_frame_partials_tma_kernel

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

# Each kernel runs one fixed tile, the fastest measured (docs/performance.md), without
# autotuning so that a fresh job pays no tuning runs. frame_softmax_partials_kernel: the
# four configurations below lie within 8% of each other; the first is best or tied.
DEFAULT_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=3),
]
# token_profiles_kernel holds a key tile (BLOCK_N, in two halves) and streams query tiles
# (BLOCK_M); 128-query tiles spill registers.
DEFAULT_PROFILE_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 256, "num_warps": 4, "num_stages": 3}
# frame_partials_given_lse_kernel (the statistics given each query's log-sum-exp).
DEFAULT_LSE_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 4}
# attention_frame_partials_kernel (attention output + frame partials): a flash-attention
# forward's tiles.
DEFAULT_FUSED_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
# attention_frame_partials_tma_kernel (the same pass with TMA loads and key tiles aligned
# to key 0); warp-specialized loops are slower with the partials.
DEFAULT_TMA_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}


def _constants(q: torch.Tensor) -> dict:
    head_dim = q.shape[-1]
    return dict(HEAD_DIM=head_dim, D_PAD=max(16, triton.next_power_of_2(head_dim)), IEEE=q.dtype == torch.float32)


def frame_softmax_partials(
    q: torch.Tensor,
    k: torch.Tensor,
    frame_seq_length: int,
    num_k: int,
    scale: float,
    config: dict | None = None,
    key_lengths: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``frame_softmax_partials_kernel``'s launch: (m, l, u, sums), each [H, Lq, num_k]
    fp32: per query and key frame, the max base-2 scaled score t, sum 2^(t - m),
    sum 2^(t - m) (m - t), and sum of raw q.k.

    Key frame f is the segment of ``key_lengths[f]`` tokens of k after the previous ones
    (default: ``num_k`` segments of ``frame_seq_length``)."""
    q, k = _unit_stride(q), _unit_stride(k)
    if key_lengths is None:
        key_lengths = (frame_seq_length,) * num_k
    starts, lengths, _ = _segments_on(q.device, tuple(int(n) for n in key_lengths))
    heads, num_queries, _ = q.shape
    m = torch.empty(heads, num_queries, num_k, dtype=torch.float32, device=q.device)
    exp_sum = torch.empty_like(m)
    u = torch.empty_like(m)
    sums = torch.empty_like(m)
    config, launch = _launch_config(config, DEFAULT_CONFIG)
    grid = (math.ceil(num_queries / config["BLOCK_M"]), heads, num_k)
    frame_softmax_partials_kernel[grid](
        q,
        k,
        starts,
        lengths,
        m,
        exp_sum,
        u,
        sums,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        num_queries,
        num_k,
        scale * LOG2E,
        **{**_constants(q), "LOOP_END": _interpreter_loop_end(max(key_lengths)), **config},
        **launch,
    )
    return m, exp_sum, u, sums


def token_profile_sums(
    q: torch.Tensor,
    k: torch.Tensor,
    lse2: torch.Tensor,
    scale: float,
    config: dict | None = None,
    key_bias2: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_profiles_kernel``'s launch: (prob_sums, logit_means), each [H, Lk] fp32:
    the sum over every query i of p_ij = 2^(t_ij - lse2_i), given each query's base-2
    log-sum-exp ``lse2`` [H, Lq] fp32; and (mean_i q_i) . k_j * scale. ``key_bias2`` [H, Lk]
    fp32: an edited call's base-2 bias of each key token, added to t (then ``lse2`` is the
    edited softmax's); the logit means stay the raw scores'."""
    q, k = _unit_stride(q), _unit_stride(k)
    heads, num_queries, head_dim = q.shape
    num_keys = k.shape[1]
    lse2 = lse2.contiguous()
    q_mean = segment_sums(q, (num_queries,))[:, 0].div_(num_queries)  # [H, D] fp32
    prob_sums = torch.empty(heads, num_keys, dtype=torch.float32, device=q.device)
    logit_means = torch.empty_like(prob_sums)
    config, launch = _launch_config(config, DEFAULT_PROFILE_CONFIG)
    grid = (math.ceil(num_keys / config["BLOCK_N"]), heads)
    token_profiles_kernel[grid](
        q,
        k,
        lse2,
        key_bias2,
        q_mean,
        prob_sums,
        logit_means,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        num_queries,
        num_keys,
        scale * LOG2E,
        scale,
        **{
            **_constants(q),
            "LOOP_END": _interpreter_loop_end(num_queries),
            "HAS_BIAS": key_bias2 is not None,
            **config,
        },
        **launch,
    )
    return prob_sums, logit_means


def _combine(
    q: torch.Tensor,
    k: torch.Tensor,
    m: torch.Tensor,
    exp_sum: torch.Tensor,
    u: torch.Tensor,
    logit_mean: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    scale: float,
    token_profiles: bool,
    profile_config: dict | None,
    bias2: torch.Tensor | None = None,
    key_lengths: Sequence[int] = (),
) -> CallStatistics:
    """Every statistic from the per-frame partials (m, l, u) of
    ``frame_softmax_partials``, each [H, Lq, num_k]; ``token_profile_sums`` for the token
    profiles. ``bias2`` [H, num_k]: an edited call's base-2 frame biases (-inf masked). A
    bias shifts a frame's scores and its max alike, so only m moves (m + b; l and u are
    relative to m); a masked frame's weight is 0 and so is its entropy term."""
    heads, num_queries, num_k = m.shape
    per_frame = (heads, num_q, frame_seq_length)
    if bias2 is not None:
        m = m + bias2[:, None, :]
    row_max = m.amax(dim=-1, keepdim=True)  # M_i, [H, Lq, 1]
    rescale = torch.exp2(m - row_max)
    weights = exp_sum * rescale
    row_sum = weights.sum(dim=-1, keepdim=True)  # L_i >= 1
    prob_mass = (weights / row_sum).view(*per_frame, num_k).mean(dim=2)
    below = rescale * (u + (row_max - m) * exp_sum)
    if bias2 is not None:  # a masked frame: 0 * inf
        below = torch.where(rescale > 0, below, 0.0)
    below_max = below.sum(dim=-1, keepdim=True)  # sum_j 2^(t-M) (M - t)
    entropy_tok = torch.log(row_sum) + LN2 * below_max / row_sum
    entropy = entropy_tok.view(per_frame).mean(dim=2)
    argmax_share = one_hot_float(m.argmax(dim=-1), num_k, torch.float32).view(*per_frame, num_k).mean(dim=2)
    stats = CallStatistics(logit_mean=logit_mean, prob_mass=prob_mass, argmax_share=argmax_share, entropy=entropy)
    if token_profiles:
        key_bias2 = None if bias2 is None else token_bias(bias2, key_lengths)
        prob_sums, stats.token_logit_mean = token_profile_sums(
            q, k, (row_max + torch.log2(row_sum))[..., 0], scale, profile_config, key_bias2
        )
        stats.token_prob_mean = prob_sums.div_(num_queries)
    return stats


def _bias2(frame_bias: torch.Tensor | None, q: torch.Tensor, num_k: int) -> torch.Tensor | None:
    """An edited call's frame biases in base 2 ([H, num_k] fp32, contiguous, on q's device), or None."""
    if frame_bias is None:
        return None
    check_bias_shape(frame_bias, q.shape[0], num_k)
    return (frame_bias.to(device=q.device, dtype=torch.float32) * LOG2E).contiguous()


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
    frame_bias: torch.Tensor | None = None,
) -> CallStatistics:
    """Every statistic of :class:`CallStatistics`: ``frame_softmax_partials``, then (only for
    token profiles) ``token_profile_sums``, and torch for the combine, all on q's device.
    ``frame_bias`` [H, num_k] (an edited call, ``sinkscope.attention.biased``): the edited
    softmax's statistics, logit_mean the raw score's (the bias enters the combine only)."""
    key_lengths = tuple(int(n) for n in key_lengths)
    num_k = len(key_lengths)
    heads = q.shape[0]
    bias2 = _bias2(frame_bias, q, num_k)
    m, exp_sum, u, sums = frame_softmax_partials(q, k, frame_seq_length, num_k, scale, config, key_lengths)
    _, _, lengths = _segments_on(q.device, key_lengths)
    logit_mean = sums.view(heads, num_q, frame_seq_length, num_k).sum(dim=2) * scale / (frame_seq_length * lengths)
    return _combine(
        q,
        k,
        m,
        exp_sum,
        u,
        logit_mean,
        frame_seq_length,
        num_q,
        scale,
        token_profiles,
        profile_config,
        bias2,
        key_lengths,
    )


def _logit_mean_by_factorization(
    q: torch.Tensor, key_sums: torch.Tensor, num_q: int, frame_seq_length: int, key_lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """[H, num_q, num_k]: (mean q of the query frame) . (mean k of the key frame) * scale,
    from the per-frame key sums [H, num_k, D] and their lengths (fp32)."""
    query_means = segment_sums(q, (frame_seq_length,) * num_q).div_(frame_seq_length)
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
    """The attention output, [Lq, H, D] in q's dtype, and every statistic:
    ``attention_frame_partials_kernel`` (one pass over the keys for both; ``_combine_fused``),
    ``token_profile_sums`` only for token profiles. q, k, v are [H, L, D]
    (any strides with unit stride last). logit_mean by factorization: (mean of the query
    frame's q) . (mean of the key frame's k) * scale, the key sums taken by the same pass."""
    key_lengths = tuple(int(n) for n in key_lengths)
    num_k = len(key_lengths)
    q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
    heads, num_queries, head_dim = q.shape
    starts, lengths, lengths_float = _segments_on(q.device, key_lengths)
    m, g, exp_sum, w = torch.empty(4, heads, num_queries, num_k, dtype=torch.float32, device=q.device).unbind(0)
    key_sums = torch.empty(heads, num_k, head_dim, dtype=torch.float32, device=q.device)
    out = torch.empty(num_queries, heads, head_dim, dtype=q.dtype, device=q.device)
    config, launch = _launch_config(config, DEFAULT_FUSED_CONFIG)
    grid = (math.ceil(num_queries / config["BLOCK_M"]), heads)
    attention_frame_partials_kernel[grid](
        q,
        k,
        v,
        out,
        starts,
        lengths,
        m,
        g,
        exp_sum,
        w,
        key_sums,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(1),
        out.stride(0),
        num_queries,
        num_k,
        scale * LOG2E,
        **{
            **_constants(q),
            "LOOP_END": _interpreter_loop_end(max(key_lengths)),
            "FRAMES_END": _interpreter_loop_end(num_k),
            **config,
        },
        **launch,
    )
    return out, _combine_fused(
        q,
        k,
        (m, g, exp_sum, w),
        key_sums[None],
        lengths_float,
        frame_seq_length,
        num_q,
        scale,
        token_profiles,
        profile_config,
    )


def _combine_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    partials: tuple[torch.Tensor, ...],
    key_part_sums: torch.Tensor,
    key_lengths: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    scale: float,
    token_profiles: bool,
    profile_config: dict | None,
    combine_config: dict | None = None,
) -> CallStatistics:
    """Every statistic from a one-pass route's partials (m, g, l, w) and the key frames' sums
    (``reductions.combine_frame_partials``, which has their meaning), and the token profiles
    from each query's log-sum-exp (``token_profile_sums``) where ``token_profiles``."""
    stats, lse2 = combine_frame_partials(
        q, partials, key_part_sums, key_lengths, frame_seq_length, num_q, scale, combine_config
    )
    if token_profiles:
        prob_sums, stats.token_logit_mean = token_profile_sums(q, k, lse2, scale, profile_config)
        stats.token_prob_mean = prob_sums.div_(q.shape[1])
    return stats


def sdpa_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [Lq, H, D], natural-log log-sum-exp [H, Lq] fp32) of one attention call
    through the model's own cached call (``sinkscope.attention.split.cached_attention``:
    FlashAttention-4's or cuDNN's attention under ``auto``, the keys split as the uncaptured
    calls split them), so that the output is theirs, bit for bit. q, k, v are [H, L, D]; ``scale`` must be 1/sqrt(D)."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        # cuDNN's op takes float32 without complaint and returns NaN (H100, torch 2.11).
        raise NotImplementedError(f"cuDNN and flash attention compute in fp16 / bf16, not {q.dtype}")
    if scale != q.shape[-1] ** -0.5:
        raise ValueError(f"the model's attention call scales by 1/sqrt(head_dim) = {q.shape[-1] ** -0.5}, not {scale}")
    out, lse = cached_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)))
    if lse is None:
        raise NotImplementedError(f"no attention kernel returns the log-sum-exp on {q.device}")
    return out[0], lse[0]


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
    """The attention call by cuDNN (its output and log-sum-exp), then
    ``statistics_given_lse`` for the frame statistics: a second pass over the keys, without
    a running max."""
    out, lse = sdpa_with_lse(q, k, v, scale)
    stats = statistics_given_lse(
        q,
        k,
        lse,
        frame_seq_length,
        num_q,
        key_lengths,
        scale,
        token_profiles=token_profiles,
        config=config,
        profile_config=profile_config,
    )
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
    frame_bias: torch.Tensor | None = None,
) -> CallStatistics:
    """Every statistic, given each query's natural-log log-sum-exp of q.k * scale over
    all keys (``lse``, [H, Lq] fp32): ``frame_partials_given_lse_kernel``,
    ``token_profile_sums`` for token profiles, a combine. ``frame_bias`` [H, num_k] (an
    edited call, ``sinkscope.attention.biased``): the bias each (head, key frame) adds to
    its scores, -inf masked; ``lse`` is then the edited softmax's (``edited_attention``
    returns it), and so are every statistic but logit_mean / token_logit_mean (raw)."""
    key_lengths = tuple(int(n) for n in key_lengths)
    num_k = len(key_lengths)
    q, k = _unit_stride(q), _unit_stride(k)
    heads, num_queries, head_dim = q.shape
    bias2 = _bias2(frame_bias, q, num_k)
    starts, lengths, lengths_float = _segments_on(q.device, key_lengths)
    lse2 = (lse * LOG2E).contiguous()
    m, prob_sum, w = torch.empty(3, heads, num_queries, num_k, dtype=torch.float32, device=q.device).unbind(0)
    key_sums = torch.empty(heads, num_k, head_dim, dtype=torch.float32, device=q.device)
    config, launch = _launch_config(config, DEFAULT_LSE_CONFIG)
    grid = (math.ceil(num_queries / config["BLOCK_M"]), heads, num_k)
    frame_partials_given_lse_kernel[grid](
        q,
        k,
        lse2,
        bias2,
        starts,
        lengths,
        m,
        prob_sum,
        w,
        key_sums,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        num_queries,
        num_k,
        scale * LOG2E,
        **{
            **_constants(q),
            "LOOP_END": _interpreter_loop_end(max(key_lengths)),
            "HAS_BIAS": bias2 is not None,
            **config,
        },
        **launch,
    )
    logit_mean = _logit_mean_by_factorization(q, key_sums, num_q, frame_seq_length, lengths_float, scale)
    per_frame = (heads, num_q, frame_seq_length)
    prob_mass = prob_sum.view(*per_frame, num_k).mean(dim=2)
    entropy = (LN2 * (lse2 - w.sum(dim=-1))).view(per_frame).mean(dim=2)
    argmax_share = one_hot_float(m.argmax(dim=-1), num_k, torch.float32).view(*per_frame, num_k).mean(dim=2)
    stats = CallStatistics(logit_mean=logit_mean, prob_mass=prob_mass, argmax_share=argmax_share, entropy=entropy)
    if token_profiles:
        key_bias2 = None if bias2 is None else token_bias(bias2, key_lengths)
        prob_sums, stats.token_logit_mean = token_profile_sums(q, k, lse2, scale, profile_config, key_bias2)
        stats.token_prob_mean = prob_sums.div_(num_queries)
    return stats


def tma_kernel_fits(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_lengths: Sequence[int], config: dict | None = None
) -> bool:
    """Whether ``attention_frame_partials_tma_kernel`` takes this call: fp16 / bf16, a
    power-of-two head size of 16 to 256, every key frame at least a key tile long, and
    every tensor as TMA can address it (16-byte aligned base and strides, unit stride
    last)."""
    block_n = _launch_config(config, DEFAULT_TMA_CONFIG)[0]["BLOCK_N"]
    return (
        q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[-1] in (16, 32, 64, 128, 256)
        and min(key_lengths) >= block_n
        and all(
            x.stride(-1) == 1
            and x.data_ptr() % 16 == 0
            and all(stride * x.element_size() % 16 == 0 for stride in x.stride()[:-1])
            for x in (q, k, v)
        )
    )


def _descriptor(x: torch.Tensor, rows: int):
    """A TMA descriptor of one [H, L, D] operand, read [1, rows, D] at a time."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(x, list(x.shape), list(x.stride()), [1, rows, x.shape[-1]])


def attention_statistics_tma(
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
    """As :func:`attention_statistics_triton`, by ``tma_attention`` (TMA loads, key tiles
    aligned to key 0) and the combine; for calls where :func:`tma_kernel_fits`. logit_mean
    by factorization in the combine, the key frames' sums by ``segment_sums``."""
    key_lengths = tuple(int(n) for n in key_lengths)
    out, partials = tma_attention(q, k, v, key_lengths, scale, config=config)
    _, _, lengths_float = _segments_on(q.device, key_lengths)
    return out, _combine_fused(
        _unit_stride(q),
        k,
        partials,
        segment_part_sums(k, key_lengths),
        lengths_float,
        frame_seq_length,
        num_q,
        scale,
        token_profiles,
        profile_config,
    )


def tma_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_lengths: Sequence[int],
    scale: float,
    *,
    stats: bool = True,
    warp_specialize: bool = False,
    config: dict | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """``attention_frame_partials_tma_kernel``'s launch: (output [Lq, H, D], (m, g, l, w) each [H, Lq, num_k] fp32), or
    (output, ()) with ``stats`` False: then a plain flash-attention forward over one segment."""
    key_lengths = tuple(int(n) for n in key_lengths) if stats else (k.shape[1],)
    num_k = len(key_lengths)
    heads, num_queries, head_dim = q.shape
    config, launch = _launch_config(config, DEFAULT_TMA_CONFIG)
    partials = torch.empty(4, heads, num_queries, num_k, dtype=torch.float32, device=q.device)
    out = torch.empty(num_queries, heads, head_dim, dtype=q.dtype, device=q.device)
    grid = (math.ceil(num_queries / config["BLOCK_M"]), heads)
    attention_frame_partials_tma_kernel[grid](
        _descriptor(q, config["BLOCK_M"]),
        _descriptor(k, config["BLOCK_N"]),
        _descriptor(v, config["BLOCK_N"]),
        out,
        _frame_ends_on(q.device, key_lengths),
        *partials.unbind(0),
        out.stride(1),
        out.stride(0),
        num_queries,
        k.shape[1],
        num_k,
        scale * LOG2E,
        HEAD_DIM=head_dim,
        STATS=stats,
        WARP_SPECIALIZE=warp_specialize,
        LOOP_END=_interpreter_loop_end(k.shape[1]),
        FRAMES_END=_interpreter_loop_end(num_k),
        **config,
        **launch,
    )
    return out, tuple(partials.unbind(0)) if stats else ()

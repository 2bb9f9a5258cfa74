"""The ``frames`` capture route: attention over each key frame apart, merged by log-sum-exps.

Every key frame's keys run as their own batch entry of one attention call (the queries
repeated for each), so the call itself gives each (query, key frame) the log-sum-exp
``lse_f`` of its scores over that frame. The frames merge exactly as the key split's parts
do (``sinkscope.attention.split.merge_parts``): out = sum_f exp(lse_f - lse) out_f with
lse = log sum_f exp(lse_f), the layer's output within one rounding to the model dtype of
the uncaptured call's. From the same numbers, with no second pass over the keys:

- ``prob_mass[h, qf, f]`` = the mean over qf's query tokens of exp(lse_f - lse), exact;
- ``logit_mean`` = (mean q of qf) . (mean k of f) * scale, exact (a [queries x D] x [D x
  frames] product of the frames' sums).

``argmax_share`` and ``entropy`` are not functions of the frames' log-sum-exps: they need
the scores themselves (each frame's max; sum_j p_ij s_ij), so this route leaves them out
(NaN; ``capture.statistics`` says which a study takes, docs/statistics.md the cost of each).
Token profiles, where asked for, take ``token_profiles_kernel``'s pass given the merged
log-sum-exp, as the other routes do.

On CUDA in fp16 / bf16 the attention is the model's kernel (FlashAttention-4's or cuDNN's,
``capture.attention_kernel``), with its log-sum-exp
(``sinkscope.attention.split.attention_with_lse``); on the CPU and in float32 / float64,
PyTorch's CPU flash attention or the same maths in torch: the same function, tested against
the float64 brute force.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sinkscope.attention.split import attention_with_lse, merge_parts
from sinkscope.stats.reference import CallStatistics, logit_mean_factorized, statistics_chunked

# The frame statistics of CallStatistics, in their table order.
FRAME_STATISTICS = ("logit_mean", "prob_mass", "argmax_share", "entropy")
# What the frames' log-sum-exps and the frames' key sums give exactly.
FRAMES_ROUTE_STATISTICS = ("logit_mean", "prob_mass")


def frame_runs(key_lengths: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """Runs of consecutive key frames of one length: (first token, first frame, frames,
    tokens a frame) each; a run is one attention call of ``frame_attention``."""
    runs: list[tuple[int, int, int, int]] = []
    token = 0
    for index, length in enumerate(int(n) for n in key_lengths):
        if runs and runs[-1][3] == length:
            start, first, count, _ = runs[-1]
            runs[-1] = (start, first, count + 1, length)
        else:
            runs.append((token, index, 1, length))
        token += length
    return runs


def _frames_of_run(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, run: tuple[int, int, int, int], scale: float, kernel: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(outputs [frames, H, Lq, D], log-sum-exps [frames, H, Lq] fp32) of one run's key frames."""
    start, _, count, length = run
    heads, num_q, dim = q.shape
    stop = start + count * length
    # [H, count x length, D] -> [count, H, length, D]: views of the model's key layout.
    keys, values = (x[:, start:stop].unflatten(1, (count, length)).transpose(0, 1) for x in (k, v))
    queries = q[None].expand(count, heads, num_q, dim)
    if count > 1 and not (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)):
        # cuDNN and FlashAttention-4 read the shared queries through a zero batch stride (cuDNN:
        # the same output bit for bit as from a copy a frame, at the same speed: frame_route.py).
        queries = queries.contiguous()
    try:
        return attention_with_lse(queries, keys, values, scale, kernel)
    except NotImplementedError:  # CUDA in float32: no kernel returns the log-sum-exp
        pass
    scores = torch.matmul(queries.float(), keys.float().transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1), values.float()).to(q.dtype)
    return out, lse


def frame_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_lengths: Sequence[int],
    scale: float | None = None,
    kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of q over k, v ([H, L, D], the capture's views), each key frame (a segment
    of ``key_lengths[f]`` tokens of k, in order) attended apart and the frames merged:
    (output [Lq, H, D] in q's dtype, each frame's log-sum-exp [F, H, Lq] fp32, each query's
    log-sum-exp over every key [H, Lq] fp32). Consecutive frames of one length are one call,
    of ``kernel`` (``KernelSettings.attention_kernel``)."""
    lengths = tuple(int(n) for n in key_lengths)
    if sum(lengths) != k.shape[1]:
        raise ValueError(f"key_lengths add up to {sum(lengths)} tokens; k has {k.shape[1]}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    parts = [_frames_of_run(q, k, v, run, scale, kernel) for run in frame_runs(lengths)]
    outs = parts[0][0] if len(parts) == 1 else torch.cat([out for out, _ in parts])
    frame_lse = parts[0][1] if len(parts) == 1 else torch.cat([lse for _, lse in parts])
    frame_lse = frame_lse.float()
    merged, lse = merge_parts(outs, frame_lse, 1, len(lengths))
    return merged[0], frame_lse, lse[0]


def frame_logit_mean(
    q: torch.Tensor,
    k: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    key_lengths: Sequence[int],
    scale: float,
    *,
    triton: bool | None = None,
) -> torch.Tensor:
    """[H, num_q, F] fp32: (mean q of the query frame) . (mean k of the key frame) * scale;
    the frames' sums by ``segment_sums_kernel`` where ``triton`` (default: on CUDA), else in
    torch (float64 on the CPU)."""
    lengths = tuple(int(n) for n in key_lengths)
    if not (q.is_cuda if triton is None else triton):
        dtype = torch.float64 if q.device.type == "cpu" else torch.float32
        return logit_mean_factorized(q, k, num_q, len(lengths), scale, dtype, lengths).float()
    from sinkscope.stats.launch_support import _segments_on
    from sinkscope.stats.reductions import segment_sums

    query_means = segment_sums(q, (frame_seq_length,) * num_q).div_(frame_seq_length)
    key_sums = segment_sums(k, lengths)
    counts = _segments_on(q.device, lengths)[2]
    return torch.einsum("hqd,hkd->hqk", query_means, key_sums).mul_(scale).div_(counts)


def statistics_from_frames(
    q: torch.Tensor,
    k: torch.Tensor,
    frame_lse: torch.Tensor,
    lse: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    key_lengths: Sequence[int],
    scale: float,
    *,
    statistics: Sequence[str] = FRAMES_ROUTE_STATISTICS,
    token_profiles: bool = False,
) -> CallStatistics:
    """The :class:`CallStatistics` of ``frame_attention``'s numbers for the queries q [H, Lq, D]
    (``frame_lse`` [F, H, Lq], ``lse`` [H, Lq]): ``statistics`` (of ``logit_mean`` and
    ``prob_mass``), every other frame statistic NaN; token profiles given ``lse``."""
    unknown = sorted(set(statistics) - set(FRAMES_ROUTE_STATISTICS))
    if unknown:
        raise ValueError(f"the frames route gives {' and '.join(FRAMES_ROUTE_STATISTICS)}, not {', '.join(unknown)}")
    heads, num_queries, _ = q.shape
    num_k = len(key_lengths)
    per_frame = (heads, num_q, frame_seq_length)
    nan = float("nan")
    prob_mass = q.new_full((heads, num_q, num_k), nan, dtype=torch.float32)
    if "prob_mass" in statistics:
        # [F, H, Lq] -> the mean over each query frame's tokens -> [H, num_q, F]
        weights = torch.exp_(frame_lse - lse[None])
        prob_mass = weights.view(num_k, *per_frame).mean(dim=-1).permute(1, 2, 0).contiguous()
    logit_mean = prob_mass.new_full((heads, num_q, num_k), nan)
    if "logit_mean" in statistics:
        logit_mean = frame_logit_mean(q, k, frame_seq_length, num_q, key_lengths, scale)
    stats = CallStatistics(
        logit_mean=logit_mean,
        prob_mass=prob_mass,
        argmax_share=prob_mass.new_full((heads, num_q, num_k), nan),
        entropy=prob_mass.new_full((heads, num_q), nan),
    )
    if token_profiles:
        if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
            from sinkscope.stats.launch import LOG2E, token_profile_sums

            prob_sums, stats.token_logit_mean = token_profile_sums(q, k, (lse * LOG2E).contiguous(), scale)
            stats.token_prob_mean = prob_sums.div_(num_queries)
        else:
            ref = statistics_chunked(q, k, frame_seq_length, num_q, key_lengths, scale, token_profiles=True)
            stats.token_logit_mean, stats.token_prob_mean = ref.token_logit_mean, ref.token_prob_mean
    return stats


def keep_statistics(stats: CallStatistics, statistics: Sequence[str]) -> CallStatistics:
    """``stats`` with every frame statistic not in ``statistics`` NaN (in place; returned)."""
    for name in FRAME_STATISTICS:
        if name not in statistics:
            setattr(stats, name, torch.full_like(getattr(stats, name), float("nan")))
    return stats


__all__ = [
    "FRAMES_ROUTE_STATISTICS",
    "FRAME_STATISTICS",
    "frame_attention",
    "frame_logit_mean",
    "frame_runs",
    "keep_statistics",
    "statistics_from_frames",
]

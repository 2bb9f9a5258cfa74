"""Reference implementations of the call statistics, in plain torch (any device).

Also home of :class:`CallStatistics` (re-exported by ``sinkscope.stats.attention``), so
that both backends can build it without importing the package's ``__init__``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from sinkscope.attention.biased import check_bias_shape, token_bias

# Scores held at once by the chunked softmax: 2**26 fp32 values = 256 MiB. A chunk's
# scores and one more buffer of the same size (its log-probabilities, then its
# probabilities) are what exist at once, plus small per-row results.
DEFAULT_SCORE_BUDGET = 2**26


@dataclass
class CallStatistics:
    """Statistics of one self-attention call, all float32 on q's device.

    Frames are named by position: axis 1 follows ``query_frames``, axis 2 (and the
    key-token axis) follows ``key_frames`` / the order of k.

    - ``logit_mean`` [H, nq, nk]: mean over the frame pair's token pairs of s_ij = q_i.k_j*scale.
    - ``prob_mass`` [H, nq, nk]: mean over qf's query tokens of the softmax mass (over every
      key token of the call) that falls on kf's tokens; sums to 1 over kf.
    - ``argmax_share`` [H, nq, nk]: share of qf's query tokens whose single highest-scoring
      key token lies in kf (ties: the first such token in k); sums to 1 over kf.
    - ``entropy`` [H, nq]: mean over qf's query tokens of H_i = -sum_j p_ij ln p_ij, in nats,
      over every key token of the call; within [0, ln Lk].
    - ``token_logit_mean`` [H, Lk] or None: mean over all query tokens of the call of s_ij.
    - ``token_prob_mean`` [H, Lk] or None: mean over all query tokens of the call of p_ij.
      The token profiles are None unless asked for (``token_profiles=True``).

    Of an edited call (``frame_bias``: ``sinkscope.attention.biased``), p is the edited
    softmax (prob_mass, argmax_share, entropy, token_prob_mean: a masked key frame gets 0)
    and s the raw score before the edit (logit_mean, token_logit_mean).
    """

    logit_mean: torch.Tensor
    prob_mass: torch.Tensor
    argmax_share: torch.Tensor
    entropy: torch.Tensor
    token_logit_mean: torch.Tensor | None = None
    token_prob_mean: torch.Tensor | None = None


def key_segments(key_lengths: Sequence[int]) -> list[tuple[int, int]]:
    """(start, stop) in k of each key frame's contiguous segment, in k's order."""
    bounds, start = [], 0
    for length in key_lengths:
        bounds.append((start, start + int(length)))
        start += int(length)
    return bounds


@lru_cache(maxsize=256)
def _token_frames(key_lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """[Lk] int64: the position (in ``key_frames``) of the frame of each key token;
    cached per layout and device (the few layouts of a generation repeat every call)."""
    lengths = torch.tensor(key_lengths, device=device)
    return torch.repeat_interleave(torch.arange(len(key_lengths), device=device), lengths)


@lru_cache(maxsize=256)
def _frame_indicator(key_lengths: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return one_hot_float(_token_frames(key_lengths, device), len(key_lengths), dtype)


def frame_indicator(key_lengths: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[Lk, nk] 0/1 matrix: token j belongs to key frame (position) f. Sums per frame are a
    matmul with it. Cached per layout, dtype and device (treat it as read-only)."""
    return _frame_indicator(tuple(int(n) for n in key_lengths), dtype, torch.device(device))


def one_hot_float(index: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """[..., num_classes] 0/1 of an integer tensor, without one_hot's device-side range check."""
    out = torch.zeros(*index.shape, num_classes, dtype=dtype, device=index.device)
    return out.scatter_(-1, index.unsqueeze(-1), 1.0)


def frame_max(scores: torch.Tensor, key_lengths: Sequence[int]) -> torch.Tensor:
    """[..., nk]: the max of the last axis over each key frame's segment."""
    if len(set(key_lengths)) == 1:
        return scores.unflatten(-1, (len(key_lengths), key_lengths[0])).amax(dim=-1)
    return torch.stack([scores[..., a:b].amax(dim=-1) for a, b in key_segments(key_lengths)], dim=-1)


def logit_mean_factorized(
    q: torch.Tensor,
    k: torch.Tensor,
    num_q: int,
    num_k: int,
    scale: float,
    dtype: torch.dtype,
    key_lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """mean_{i in qf, j in kf} q_i.k_j * scale = (mean_i q_i).(mean_j k_j) * scale, [H, nq, nk].

    Query frames are ``num_q`` equal parts of q; key frames are ``key_lengths`` segments of k
    (default: ``num_k`` equal segments), each divided by its own token count.
    """
    heads, _, dim = q.shape
    q_mean = q.reshape(heads, num_q, -1, dim).to(dtype).mean(dim=2)
    if key_lengths is None or len(set(key_lengths)) == 1:
        k_mean = k.reshape(heads, num_k, -1, dim).to(dtype).mean(dim=2)
    else:
        indicator = frame_indicator(key_lengths, dtype, k.device)  # [Lk, nk]
        counts = indicator.sum(dim=0)
        k_mean = torch.matmul(indicator.t(), k.to(dtype)) / counts[:, None]
    return torch.matmul(q_mean, k_mean.transpose(1, 2)) * scale


def token_mean(x: torch.Tensor, dtype: torch.dtype, budget: int = 2**20) -> torch.Tensor:
    """[H, D]: the mean over axis 1 of x [H, L, D], accumulated in ``dtype``.

    x is converted ``budget`` values at a time: torch's own ``sum(dim, dtype=...)`` of a
    bf16 CUDA tensor made whole fp32 copies (a 56 MiB peak for a 14 MiB q, on an H100).
    """
    heads, length, dim = x.shape
    rows = max(1, budget // max(1, heads * dim))
    total = torch.zeros(heads, dim, dtype=dtype, device=x.device)
    for start in range(0, length, rows):
        total += x[:, start : start + rows].to(dtype).sum(dim=1)
    return total / max(1, length)


def token_logit_mean_factorized(q: torch.Tensor, k: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """mean over every query token of q_i.k_j * scale = (mean_i q_i).k_j * scale, [H, Lk].

    q and k are converted to ``dtype`` a few rows or heads at a time (at most 2**22
    values), so the copies stay small next to the call's own tensors.
    """
    heads, _, dim = q.shape
    q_mean = token_mean(q, dtype, 2**22)  # [H, D]
    per_chunk = max(1, 2**22 // max(1, k.shape[1] * dim))
    out = torch.empty(heads, k.shape[1], dtype=dtype, device=q.device)
    for h in range(0, heads, per_chunk):
        stop = min(h + per_chunk, heads)
        out[h:stop] = torch.matmul(k[h:stop].to(dtype), q_mean[h:stop, :, None])[..., 0]
    return out * scale


def statistics_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    key_lengths: Sequence[int],
    scale: float,
    *,
    token_profiles: bool = False,
    score_budget: int = DEFAULT_SCORE_BUDGET,
    frame_bias: torch.Tensor | None = None,
) -> CallStatistics:
    """Every statistic of :class:`CallStatistics`, exact softmax, one pass over query chunks.

    Each chunk of queries (``score_budget`` scores at most) has its scores computed in
    fp32, and from them: each key frame's max score (the top frame is the argmax over
    frames, ties to the lowest position, as in the Triton path), log-probabilities
    (``log_softmax``), probabilities, each token's mass per key frame (a matmul with the
    0/1 token-to-frame matrix), its entropy -sum p log p (each term finite and of one
    sign, no cancellation), and, with ``token_profiles``, the column sums of p. Per-token
    results are accumulated over query tokens in float64 on the CPU (fp32 elsewhere).

    ``frame_bias`` [H, num_k] (``sinkscope.attention.biased``: 0 untouched, finite added to
    the scores of that head and key frame, -inf masked): the statistics of the edited
    softmax. Its scores give prob_mass, argmax_share, entropy and token_prob_mean (a masked
    frame gets exactly 0 mass and never the argmax); logit_mean and token_logit_mean stay
    the raw q.k * scale, before the edit.
    """
    heads, num_queries, _ = q.shape
    num_keys = k.shape[1]
    num_k = len(key_lengths)
    device = q.device
    accumulate = torch.float64 if device.type == "cpu" else torch.float32
    keys_t = k.float().transpose(1, 2)
    indicator = frame_indicator(key_lengths, torch.float32, device)  # [Lk, nk]
    chunk = max(1, score_budget // (heads * num_keys))
    mass_tok = torch.empty(heads, num_queries, num_k, dtype=torch.float32, device=device)
    entropy_tok = torch.empty(heads, num_queries, dtype=torch.float32, device=device)
    argmax_tok = torch.empty(heads, num_queries, dtype=torch.long, device=device)
    col_sum = torch.zeros(heads, num_keys, dtype=accumulate, device=device) if token_profiles else None
    bias = masked = None
    if frame_bias is not None:
        check_bias_shape(frame_bias, heads, num_k)
        bias = token_bias(frame_bias.to(device), key_lengths)[:, None, :]  # [H, 1, Lk]
        masked = bool(torch.isneginf(frame_bias).any())
    for start in range(0, num_queries, chunk):
        stop = min(start + chunk, num_queries)
        scores = torch.matmul(q[:, start:stop].float(), keys_t).mul_(scale)
        if bias is not None:
            scores += bias
        # The frame of the top key token = the frame with the largest max; torch.argmax
        # returns the first maximal index, so ties go to the earliest frame position.
        argmax_tok[:, start:stop] = frame_max(scores, key_lengths).argmax(dim=-1)
        log_p = torch.log_softmax(scores, dim=-1)
        del scores
        if masked:  # masked keys: p = 0 and p log p = 0 (a finite log p, not 0 * -inf)
            log_p.clamp_(min=torch.finfo(log_p.dtype).min)
        probs = log_p.exp()
        mass_tok[:, start:stop] = torch.matmul(probs, indicator)
        if col_sum is not None:
            col_sum += probs.sum(dim=1).to(accumulate)
        # p log p: exp underflows to 0 only where log p is finite, so never 0 * inf.
        entropy_tok[:, start:stop] = probs.mul_(log_p).sum(dim=-1).neg_()
        del log_p, probs
    per_frame = (heads, num_q, frame_seq_length)
    prob_mass = mass_tok.to(accumulate).view(*per_frame, num_k).mean(dim=2)
    entropy = entropy_tok.to(accumulate).view(per_frame).mean(dim=2)
    argmax_share = one_hot_float(argmax_tok, num_k, accumulate).view(*per_frame, num_k).mean(dim=2)
    logit_mean = logit_mean_factorized(q, k, num_q, num_k, scale, accumulate, key_lengths)
    stats = CallStatistics(
        logit_mean=logit_mean.float(),
        prob_mass=prob_mass.float(),
        argmax_share=argmax_share.float(),
        entropy=entropy.float(),
    )
    if token_profiles:
        stats.token_logit_mean = token_logit_mean_factorized(q, k, scale, accumulate).float()
        stats.token_prob_mean = (col_sum / num_queries).float()
    return stats

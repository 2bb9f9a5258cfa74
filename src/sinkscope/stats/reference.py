"""Reference implementations of the frame statistics, in plain torch (any device)."""

from __future__ import annotations

import torch

# Scores held at once by the chunked softmax: 2**26 fp32 values = 256 MiB.
DEFAULT_SCORE_BUDGET = 2**26


def logit_mean_factorized(
    q: torch.Tensor, k: torch.Tensor, num_q: int, num_k: int, scale: float, dtype: torch.dtype
) -> torch.Tensor:
    """mean_{i in qf, j in kf} q_i.k_j * scale = (mean_i q_i).(mean_j k_j) * scale, [H, nq, nk]."""
    heads, _, dim = q.shape
    q_mean = q.reshape(heads, num_q, -1, dim).to(dtype).mean(dim=2)
    k_mean = k.reshape(heads, num_k, -1, dim).to(dtype).mean(dim=2)
    return torch.matmul(q_mean, k_mean.transpose(1, 2)) * scale


def prob_mass_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    num_k: int,
    scale: float,
    score_budget: int = DEFAULT_SCORE_BUDGET,
) -> torch.Tensor:
    """Softmax mass per key frame, averaged over each query frame's tokens, [H, nq, nk] fp32.

    Exact softmax over every key, one chunk of queries at a time: the scores of a
    chunk (``score_budget`` values at most) and their softmax are all that exist at once.
    """
    heads, num_queries, _ = q.shape
    num_keys = k.shape[1]
    keys_t = k.float().transpose(1, 2)
    chunk = max(1, score_budget // (heads * num_keys))
    per_token = torch.empty(heads, num_queries, num_k, dtype=torch.float32, device=q.device)
    for start in range(0, num_queries, chunk):
        stop = min(start + chunk, num_queries)
        scores = torch.matmul(q[:, start:stop].float(), keys_t).mul_(scale)
        probs = torch.softmax(scores, dim=-1)
        per_token[:, start:stop] = probs.view(heads, stop - start, num_k, frame_seq_length).sum(dim=-1)
    return per_token.view(heads, num_q, frame_seq_length, num_k).mean(dim=2)

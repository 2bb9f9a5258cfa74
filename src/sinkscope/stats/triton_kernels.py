"""Triton kernel for both frame statistics: one pass over the keys, scores never stored.

Each program owns BLOCK_M queries of one head and one key frame. It streams that
frame's keys in tiles of BLOCK_N, keeping per query a running max m and a running sum
l of exp(s - m) (base 2, the scale folded into log2(e)), and the plain sum of the raw
scores q.k. The output is (m, l, sum) per (head, query token, key frame), a few MiB;
torch then combines the frames: mass_f = l_f 2^(m_f - max m) / sum_g l_g 2^(m_g - max m),
and averages each query frame; logit_mean is the summed scores over the frame pair,
divided by its token pairs, times the scale.

Splitting the grid by key frame gives 3 x 12 x ceil(Lq / BLOCK_M) independent programs
even for the first block, needs no per-frame accumulators in registers, and works for
any number of key frames (sliding windows, sinks, long videos).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634

# Measured on H100 and H200 (docs/performance.md): all four within 8% of each other, the
# first best or tied; it is the default, used without autotuning so that a fresh job pays
# no tuning runs.
DEFAULT_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=3),
]


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _frame_softmax_partials(
    q_ptr,
    k_ptr,
    m_ptr,
    l_ptr,
    sum_ptr,
    stride_qh,
    stride_ql,
    stride_kh,
    stride_kl,
    num_queries,
    frame_seq_length,
    num_key_frames,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    IEEE: tl.constexpr,
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
    q = tl.load(
        q_ptr + head * stride_qh + offs_m[:, None] * stride_ql + offs_d[None, :],
        mask=m_valid[:, None] & d_valid[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    raw_sum = tl.zeros([BLOCK_M], tl.float32)
    k_frame = k_ptr + head * stride_kh + frame * frame_seq_length * stride_kl
    for start in range(0, frame_seq_length, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_valid = offs_n < frame_seq_length
        k = tl.load(
            k_frame + offs_n[None, :] * stride_kl + offs_d[:, None],
            mask=n_valid[None, :] & d_valid[:, None],
            other=0.0,
        )
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)
        raw_sum += tl.sum(tl.where(n_valid[None, :], s, 0.0), 1)
        s = tl.where(n_valid[None, :], s * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
        m_i = m_new
    out = (head * num_queries + offs_m) * num_key_frames + frame
    tl.store(m_ptr + out, m_i, mask=m_valid)
    tl.store(l_ptr + out, l_i, mask=m_valid)
    tl.store(sum_ptr + out, raw_sum, mask=m_valid)


def frame_softmax_partials(
    q: torch.Tensor, k: torch.Tensor, frame_seq_length: int, num_k: int, scale: float, config: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m, l, sums), each [H, Lq, num_k]: per query and key frame, the max scaled score
    (base 2), the sum of 2^(s - m), and the sum of the raw scores q.k."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    heads, num_queries, head_dim = q.shape
    m = torch.empty(heads, num_queries, num_k, dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    sums = torch.empty_like(m)
    args = (q, k, m, l, sums, q.stride(0), q.stride(1), k.stride(0), k.stride(1), num_queries, frame_seq_length, num_k, scale * LOG2E)
    constants = dict(
        HEAD_DIM=head_dim,
        D_PAD=max(16, triton.next_power_of_2(head_dim)),
        IEEE=q.dtype == torch.float32,
    )
    if config is None:
        config = {"BLOCK_M": 16, "BLOCK_N": 16} if _interpreting() else DEFAULT_CONFIG
    config = dict(config)
    launch = {key: config.pop(key) for key in ("num_warps", "num_stages") if key in config}
    grid = (math.ceil(num_queries / config["BLOCK_M"]), heads, num_k)
    _frame_softmax_partials[grid](*args, **constants, **config, **launch)
    return m, l, sums


def frame_stats_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    num_k: int,
    scale: float,
    config: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logit_mean, prob_mass), each [H, num_q, num_k] fp32, from one kernel pass."""
    m, l, sums = frame_softmax_partials(q, k, frame_seq_length, num_k, scale, config)
    heads = q.shape[0]
    weights = l * torch.exp2(m - m.amax(dim=-1, keepdim=True))
    mass = (weights / weights.sum(dim=-1, keepdim=True)).view(heads, num_q, frame_seq_length, num_k).mean(dim=2)
    logit = sums.view(heads, num_q, frame_seq_length, num_k).sum(dim=2) * (scale / frame_seq_length**2)
    return logit, mass

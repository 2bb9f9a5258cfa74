"""Launching the reductions that touch no attention score (device code:
``sinkscope.stats.reduction_kernels``): each frame's fp32 sum of q or k (``segment_part_sums``,
``segment_sums``), which logit_mean's factorization needs, and a one-pass route's frame partials
turned into every frame statistic (``combine_frame_partials``: the combine and its finish, two
launches, their parts added in a fixed order, so the result is deterministic)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton

from sinkscope.stats.launch_support import (
    INTERPRETER_CONFIG,
    _frame_ends_on,
    _interpreter_loop_end,
    _interpreting,
    _unit_stride,
)
from sinkscope.stats.reduction_kernels import (
    frame_statistics_combine_kernel,
    frame_statistics_finish_kernel,
    segment_sums_kernel,
)
from sinkscope.stats.reference import CallStatistics

# frame_statistics_combine_kernel: query rows a program (BLOCK_M), fewer when many key frames (a long
# global cache) would make its [rows, frames] tiles larger than TILE, too large for the registers;
# frame_statistics_finish_kernel: its [parts, frames] tiles at most FINISH_TILE values.
DEFAULT_COMBINE_CONFIG = {"BLOCK_M": 64, "TILE": 2048, "FINISH_TILE": 4096, "num_warps": 4}
# segment_sums_kernel splits its segments until about PROGRAMS programs run (a few times the H100's
# 132 SMs): one program a query frame's 1560 tokens left most of the GPU idle.
DEFAULT_SEGMENT_CONFIG = {"BLOCK_L": 64, "PROGRAMS": 1024, "num_warps": 4}


def segment_part_sums(
    x: torch.Tensor, lengths: Sequence[int], *, chunk: int | None = None, config: dict | None = None
) -> torch.Tensor:
    """[parts, H, S, D] fp32: the sums of consecutive segments of ``lengths`` tokens of x
    [H, L, D] (``segment_sums_kernel``; no fp32 copy of x), each segment summed in parts of
    ``chunk`` tokens (by default enough parts for about ``config["PROGRAMS"]`` programs), for the
    caller to add in a fixed order (``segment_sums``, or the combine's finish)."""
    heads, _, head_dim = x.shape
    x = _unit_stride(x)
    lengths = tuple(int(n) for n in lengths)
    config = {**DEFAULT_SEGMENT_CONFIG, **(config or {})}
    programs = config["PROGRAMS"]
    block_l = INTERPRETER_CONFIG["BLOCK_M"] if _interpreting() else config["BLOCK_L"]
    longest = max(lengths)
    if chunk is None:
        chunk = math.ceil(longest / max(1, math.ceil(programs / (len(lengths) * heads))))
    chunk = max(1, math.ceil(chunk / block_l)) * block_l
    parts = max(1, math.ceil(longest / chunk))
    out = torch.empty(parts, heads, len(lengths), head_dim, dtype=torch.float32, device=x.device)
    segment_sums_kernel[(len(lengths), heads, parts)](
        x,
        _frame_ends_on(x.device, lengths),
        out,
        x.stride(0),
        x.stride(1),
        len(lengths),
        chunk,
        HEAD_DIM=head_dim,
        D_PAD=max(16, triton.next_power_of_2(head_dim)),
        LOOP_END=_interpreter_loop_end(chunk),
        BLOCK_L=block_l,
        num_warps=config["num_warps"],
    )
    return out


def segment_sums(
    x: torch.Tensor, lengths: Sequence[int], *, chunk: int | None = None, config: dict | None = None
) -> torch.Tensor:
    """[H, S, D] fp32: ``segment_part_sums``'s parts added in order."""
    out = segment_part_sums(x, lengths, chunk=chunk, config=config)
    return out[0] if out.shape[0] == 1 else out.sum(0)


def combine_frame_partials(
    q: torch.Tensor,
    partials: tuple[torch.Tensor, ...],
    key_part_sums: torch.Tensor,
    key_lengths: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    scale: float,
    config: dict | None = None,
) -> tuple[CallStatistics, torch.Tensor]:
    """Every statistic from the partials (m, g, l, w) of the one pass over the keys
    (``attention_frame_partials_kernel``, its TMA form or ``flash4_attention_partials``),
    each [H, Lq, num_k] (any strides, the four alike):
    per frame its max m, and the running max g that its sums l = sum 2^(t - g) and w = sum
    2^(t - g) t refer to; logit_mean by factorization from the key frames' sums
    (``key_part_sums``, [parts, H, num_k, D] fp32, ``segment_part_sums``) and lengths
    (``key_lengths``, fp32). ``frame_statistics_combine_kernel`` and
    ``frame_statistics_finish_kernel`` do it all (the maths in their docstrings). q is
    [H, Lq, D] with unit stride last. Also each query's base-2 log-sum-exp [H, Lq] fp32, which
    the token profiles take (``launch.token_profile_sums``); ``config`` over
    ``DEFAULT_COMBINE_CONFIG``."""
    m, g, exp_sum, w = partials
    heads, num_queries, num_k = m.shape
    head_dim = q.shape[-1]
    frames_pad = max(2, triton.next_power_of_2(num_k))
    config = {**DEFAULT_COMBINE_CONFIG, **(config or {})}
    block_m = (
        INTERPRETER_CONFIG["BLOCK_M"]
        if _interpreting()
        else max(8, min(config["BLOCK_M"], config["TILE"] // frames_pad))
    )
    parts = math.ceil(frame_seq_length / block_m)
    device = m.device
    # Each part's sums ([parts, H, num_q, ...]), as the combine writes them, for the finish to add.
    mass_parts, argmax_parts = torch.empty(2, parts, heads, num_q, num_k, dtype=torch.float32, device=device)
    entropy_parts = torch.empty(parts, heads, num_q, dtype=torch.float32, device=device)
    query_part_sums = torch.empty(parts, heads, num_q, head_dim, dtype=torch.float32, device=device)
    lse2 = torch.empty(heads, num_queries, dtype=torch.float32, device=device)
    d_chunk = min(32, max(16, triton.next_power_of_2(head_dim)))
    frame_statistics_combine_kernel[(num_q, heads, parts)](
        m,
        g,
        exp_sum,
        w,
        q,
        mass_parts,
        argmax_parts,
        entropy_parts,
        query_part_sums,
        lse2,
        q.stride(0),
        q.stride(1),
        *m.stride(),
        frame_seq_length,
        num_q,
        num_queries,
        num_k,
        HEAD_DIM=head_dim,
        D_CHUNK=d_chunk,
        F_PAD=frames_pad,
        BLOCK_M=block_m,
        num_warps=config["num_warps"],
    )
    prob_mass, argmax_share, logit_mean = torch.empty(3, heads, num_q, num_k, dtype=torch.float32, device=device)
    entropy = torch.empty(heads, num_q, dtype=torch.float32, device=device)
    frame_statistics_finish_kernel[(num_q, heads)](
        mass_parts,
        argmax_parts,
        entropy_parts,
        query_part_sums,
        key_part_sums,
        key_lengths,
        prob_mass,
        argmax_share,
        logit_mean,
        entropy,
        frame_seq_length,
        num_q,
        num_k,
        scale,
        PARTS=parts,
        PARTS_BLOCK=min(triton.next_power_of_2(parts), max(1, config["FINISH_TILE"] // frames_pad)),
        KEY_PARTS=key_part_sums.shape[0],
        HEAD_DIM=head_dim,
        D_CHUNK=d_chunk,
        F_PAD=frames_pad,
    )
    stats = CallStatistics(logit_mean=logit_mean, prob_mass=prob_mass, argmax_share=argmax_share, entropy=entropy)
    return stats, lse2

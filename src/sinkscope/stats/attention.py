"""Attention statistics of one self-attention call, by frame and by key token.

For a call with queries q [H, Lq, D] and the keys k [H, Lk, D] its softmax sees (post
RMSNorm and RoPE), with s_ij = q_i.k_j * scale and p_ij the softmax of row i over every
key of the call. Query frames are ``frame_seq_length`` tokens each; key frame f is a
contiguous segment of ``key_lengths[f]`` tokens of k (a policy may drop tokens; by
default every frame is whole). Frames are named by absolute index but laid out by
position: axis order follows ``query_frames`` / ``key_frames``.

- ``logit_mean[h, qf, kf]``: the mean over every token pair of s_ij. Exactly
  ``(mean of q over qf) . (mean of k over kf) * scale``, so it costs O(L D).
- ``prob_mass[h, qf, kf]``: the mean over query tokens of qf of the softmax mass that
  falls on the (present) tokens of kf. It sums to 1 over kf.
- ``argmax_share[h, qf, kf]``: the share of qf's query tokens whose top key token is in kf.
- ``entropy[h, qf]``: the mean over qf's query tokens of -sum_j p_ij ln p_ij (nats).
- token profiles (on request): per key token, the mean over all query tokens of s_ij
  and of p_ij.

``attention_statistics`` returns all of them as a :class:`CallStatistics`.

Neither path materializes the Lq x Lk score matrix: the CPU reference streams over
query chunks within a fixed memory budget; the CUDA path is a Triton kernel that
streams over key tiles with a running max, sum and entropy term per (query token, key
frame), and sums the raw scores on the way, so one pass over the keys gives every
frame statistic. The token profile of p needs each query's final normalizer before it
can sum over queries, so it takes a second pass (a second kernel) and is computed
only when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sinkscope.stats.reference import CallStatistics, statistics_chunked

__all__ = [
    "CallStatistics",
    "attention_statistics",
    "attention_with_statistics",
    "check_frame_layout",
    "resolve_key_lengths",
    "triton_available",
]

def triton_available() -> bool:
    """True where the Triton kernel can run (a CUDA device and an importable triton)."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_key_lengths(key_lengths: Sequence[int] | None, num_k: int, frame_seq_length: int) -> tuple[int, ...]:
    """The tokens of each key frame as a tuple of ints: ``key_lengths``, or ``num_k`` whole frames."""
    if key_lengths is None:
        return (int(frame_seq_length),) * num_k
    lengths = []
    for n in key_lengths:
        if isinstance(n, bool) or int(n) != n or int(n) < 1:
            raise ValueError(f"key_lengths must be positive integers; got {list(key_lengths)}")
        lengths.append(int(n))
    if len(lengths) != num_k:
        raise ValueError(f"key_lengths has {len(lengths)} entries for {num_k} key frames")
    return tuple(lengths)


def check_frame_layout(
    q: torch.Tensor,
    k: torch.Tensor,
    frame_seq_length: int,
    query_frames: Sequence[int],
    key_frames: Sequence[int],
    key_lengths: Sequence[int] | None = None,
    key_position_shift: Sequence[int] | None = None,
) -> tuple[int, ...]:
    """Raise ValueError unless q is [H, nq x frame_seq_length, D] and k [H, sum(key_lengths), D].

    Returns the key lengths (``num key frames x frame_seq_length`` by default). Key frames
    are unique, or, given ``key_position_shift``, the (frame, shift) pairs are (a policy
    may attend copies of a frame's keys at other positions: ``rolling_sink``).
    """
    if q.ndim != 3 or k.ndim != 3:
        raise ValueError(f"q and k must be [H, L, D]; got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in heads or head_dim")
    if q.device != k.device or q.dtype != k.dtype:
        raise ValueError(f"q ({q.dtype}, {q.device}) and k ({k.dtype}, {k.device}) differ in dtype or device")
    if frame_seq_length < 1:
        raise ValueError(f"frame_seq_length must be positive, got {frame_seq_length}")
    if len(query_frames) == 0 or len(key_frames) == 0:
        raise ValueError(f"a call needs query and key frames; got {list(query_frames)} and {list(key_frames)}")
    if q.shape[1] != len(query_frames) * frame_seq_length:
        raise ValueError(
            f"q has {q.shape[1]} tokens, not {len(query_frames)} query frames x {frame_seq_length}"
        )
    lengths = resolve_key_lengths(key_lengths, len(key_frames), frame_seq_length)
    if k.shape[1] != sum(lengths):
        if key_lengths is None:
            raise ValueError(
                f"k has {k.shape[1]} tokens, not {len(key_frames)} key frames x {frame_seq_length}"
            )
        raise ValueError(f"k has {k.shape[1]} tokens, not sum(key_lengths) = {sum(lengths)}")
    if key_position_shift is None:
        if len(set(key_frames)) != len(key_frames):
            raise ValueError(f"key_frames repeat a frame: {list(key_frames)}")
    else:
        if len(key_position_shift) != len(key_frames):
            raise ValueError(f"key_position_shift has {len(key_position_shift)} entries for {len(key_frames)} key frames")
        pairs = list(zip(key_frames, key_position_shift))
        if len(set(pairs)) != len(pairs):
            raise ValueError(f"key_frames repeat a frame at the same position shift: {pairs}")
    return lengths


def attention_statistics(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    frame_seq_length: int,
    query_frames: Sequence[int],
    key_frames: Sequence[int],
    key_lengths: Sequence[int] | None = None,
    token_profiles: bool = False,
    scale: float | None = None,
    backend: str = "auto",
    key_position_shift: Sequence[int] | None = None,
) -> CallStatistics:
    """Every statistic of one attention call, as a :class:`CallStatistics` on q's device.

    q [H, Lq, D] holds the tokens of ``query_frames`` in order, ``frame_seq_length``
    each; k [H, Lk, D] holds one contiguous segment per key frame, in ``key_frames``
    order (not necessarily ascending), ``key_lengths[i]`` tokens long (default: every
    frame whole). The frame lists name absolute latent frames (they only label the
    result). ``scale`` defaults to D**-0.5. ``token_profiles``: also the per-key-token
    means (``token_logit_mean``, ``token_prob_mean``); on CUDA this costs a second kernel
    pass over the call, so it is off by default. ``backend``: "auto" (Triton on CUDA when
    available, else torch), "torch" (the chunked reference, any device) or "triton".
    """
    lengths = check_frame_layout(q, k, frame_seq_length, query_frames, key_frames, key_lengths, key_position_shift)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    num_q = len(query_frames)
    if _resolve_backend(q, backend) == "triton":
        from sinkscope.stats.triton_kernels import statistics_triton

        return statistics_triton(q, k, frame_seq_length, num_q, lengths, scale, token_profiles=token_profiles)
    return statistics_chunked(q, k, frame_seq_length, num_q, lengths, scale, token_profiles=token_profiles)


def _resolve_backend(q: torch.Tensor, backend: str) -> str:
    """'triton' or 'torch': "auto" is Triton on CUDA where it runs, else torch."""
    if backend == "auto":
        return "triton" if q.is_cuda and triton_available() else "torch"
    if backend not in ("triton", "torch"):
        raise ValueError(f"unknown statistics backend {backend!r}; use 'auto', 'torch' or 'triton'")
    if backend == "triton" and not q.is_cuda:
        raise ValueError(f"the triton backend needs CUDA tensors; q is on {q.device} (use backend 'torch' or 'auto')")
    return backend



def attention_with_statistics(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    frame_seq_length: int,
    query_frames: Sequence[int],
    key_frames: Sequence[int],
    key_lengths: Sequence[int] | None = None,
    token_profiles: bool = False,
    scale: float | None = None,
    backend: str = "auto",
    key_position_shift: Sequence[int] | None = None,
    fused: bool = False,
) -> tuple[torch.Tensor, CallStatistics]:
    """The attention call itself and its statistics: (output [Lq, H, D] in q's dtype,
    :class:`CallStatistics`). Arguments as :func:`attention_statistics`, plus v [H, Lk, D].

    On CUDA, by default: cuDNN's attention (what SDPA runs on Hopper) gives the output and
    each query's log-sum-exp, and one Triton pass over the keys (kernel 4) the statistics,
    whose probabilities are then final (``triton_kernels.attention_statistics_lse``): the
    output is SDPA's, bit for bit, so capturing does not change the generation. With
    ``fused`` (config ``capture.attention: fused``), in fp16 / bf16 with every key frame at
    least a key tile (64 keys) long: kernel 5, a flash-attention forward in Triton that
    keeps every frame's partials as it goes, then kernel 6 (``attention_statistics_tma``):
    one pass, the output SDPA's within bf16 rounding. Where no backend returns the
    log-sum-exp (float32): kernel 3, kernel 5's pass without TMA (``attention_statistics_triton``;
    the output within float32 rounding). Elsewhere: SDPA, then the chunked reference.
    docs/performance.md compares them.
    """
    lengths = check_frame_layout(q, k, frame_seq_length, query_frames, key_frames, key_lengths, key_position_shift)
    if v.shape[:2] != k.shape[:2] or v.dtype != k.dtype or v.device != k.device:
        raise ValueError(f"v {tuple(v.shape)} ({v.dtype}, {v.device}) does not match k {tuple(k.shape)}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if _resolve_backend(q, backend) == "triton":
        from sinkscope.stats.triton_kernels import (
            attention_statistics_lse,
            attention_statistics_tma,
            attention_statistics_triton,
            tma_kernel_fits,
        )

        args = (q, k, v, frame_seq_length, len(query_frames), lengths, scale)
        if fused and tma_kernel_fits(q, k, v, lengths):
            return attention_statistics_tma(*args, token_profiles=token_profiles)
        try:
            return attention_statistics_lse(*args, token_profiles=token_profiles)
        except NotImplementedError:
            return attention_statistics_triton(*args, token_profiles=token_profiles)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale).transpose(0, 1)
    stats = statistics_chunked(q, k, frame_seq_length, len(query_frames), lengths, scale, token_profiles=token_profiles)
    return out, stats

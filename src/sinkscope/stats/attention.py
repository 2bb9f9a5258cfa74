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

An edited call (``frame_bias``, ``sinkscope.attention.biased``: a bias per head and key
frame added to s_ij, -inf masking the frame) has the statistics of the softmax the model
used: p_ij, and so prob_mass, argmax_share, entropy and the token profile of p, are the
edited softmax's (a masked frame gets exactly 0 mass and never the argmax), while
logit_mean and the token profile of s stay the raw s_ij, before the edit.

``attention_statistics`` returns all of them as a :class:`CallStatistics`; they never feed
the attention's output, which the model's own call computes (``attention_with_statistics``
gives both, for the capture's routes).

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

from sinkscope.attention.biased import bias_rows, check_bias_shape, edited_attention
from sinkscope.attention.split import cached_attention
from sinkscope.stats.reference import CallStatistics, statistics_chunked
from sinkscope.stats.segments import (
    FRAME_STATISTICS,
    FRAMES_ROUTE_STATISTICS,
    frame_attention,
    frame_logit_mean,
    keep_statistics,
    statistics_from_frames,
)

__all__ = [
    "FRAME_STATISTICS",
    "FRAMES_ROUTE_STATISTICS",
    "CallStatistics",
    "attention_statistics",
    "check_statistics",
    "attention_with_statistics",
    "check_frame_bias",
    "check_frame_layout",
    "fused_route_applies",
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
        raise ValueError(f"q has {q.shape[1]} tokens, not {len(query_frames)} query frames x {frame_seq_length}")
    lengths = resolve_key_lengths(key_lengths, len(key_frames), frame_seq_length)
    if k.shape[1] != sum(lengths):
        if key_lengths is None:
            raise ValueError(f"k has {k.shape[1]} tokens, not {len(key_frames)} key frames x {frame_seq_length}")
        raise ValueError(f"k has {k.shape[1]} tokens, not sum(key_lengths) = {sum(lengths)}")
    if key_position_shift is None:
        if len(set(key_frames)) != len(key_frames):
            raise ValueError(f"key_frames repeat a frame: {list(key_frames)}")
    else:
        if len(key_position_shift) != len(key_frames):
            raise ValueError(
                f"key_position_shift has {len(key_position_shift)} entries for {len(key_frames)} key frames"
            )
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
    lse: torch.Tensor | None = None,
    frame_bias: torch.Tensor | None = None,
    statistics: Sequence[str] = FRAME_STATISTICS,
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
    ``lse``: each query's natural-log log-sum-exp of the scores over every key ([H, Lq]
    fp32, as the attention call returns it, ``cached_attention``): the Triton path then
    takes the pass that needs no running max (``frame_partials_given_lse_kernel``); the
    reference ignores it. ``frame_bias`` [H, len(key_frames)] float32 (an edited call:
    0 untouched, finite added to every s_ij of that head and key frame, -inf masked; as
    ``sinkscope.attention.biased.edited_attention`` takes it): prob_mass, argmax_share,
    entropy and token_prob_mean are the edited softmax's (``lse``, if given, must be its
    log-sum-exp, as ``edited_attention`` returns it), logit_mean and token_logit_mean the
    raw q.k * scale before the edit. None leaves every path as without edits.
    ``statistics``: the frame statistics to give (``capture.statistics``); the others are
    NaN. ``logit_mean`` alone needs no pass over the scores (the frames' mean q and k).
    """
    lengths = check_frame_layout(q, k, frame_seq_length, query_frames, key_frames, key_lengths, key_position_shift)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    num_q = len(query_frames)
    check_statistics(statistics)
    if frame_bias is not None:
        check_frame_bias(frame_bias, q.shape[0], len(lengths))
    triton = _resolve_backend(q, backend) == "triton"
    if set(statistics) == {"logit_mean"} and not token_profiles:
        logit_mean = frame_logit_mean(q, k, frame_seq_length, num_q, lengths, scale, triton=triton)
        nan = float("nan")
        return CallStatistics(
            logit_mean=logit_mean,
            prob_mass=torch.full_like(logit_mean, nan),
            argmax_share=torch.full_like(logit_mean, nan),
            entropy=logit_mean.new_full(logit_mean.shape[:2], nan),
        )
    stats = _all_statistics(q, k, frame_seq_length, num_q, lengths, scale, triton, token_profiles, lse, frame_bias)
    return keep_statistics(stats, statistics)


def _all_statistics(
    q: torch.Tensor,
    k: torch.Tensor,
    frame_seq_length: int,
    num_q: int,
    lengths: tuple[int, ...],
    scale: float,
    triton: bool,
    token_profiles: bool,
    lse: torch.Tensor | None,
    frame_bias: torch.Tensor | None,
) -> CallStatistics:
    """Every statistic of :func:`attention_statistics`, by the backend's pass over the scores
    (``triton``: the Triton kernels, else the chunked reference)."""
    if triton:
        from sinkscope.stats.launch import statistics_given_lse, statistics_triton

        if lse is not None:
            if lse.shape != q.shape[:2]:
                raise ValueError(
                    f"lse {tuple(lse.shape)} does not match q {tuple(q.shape)}: one value per head and query"
                )
            return statistics_given_lse(
                q, k, lse, frame_seq_length, num_q, lengths, scale, token_profiles=token_profiles, frame_bias=frame_bias
            )
        return statistics_triton(
            q, k, frame_seq_length, num_q, lengths, scale, token_profiles=token_profiles, frame_bias=frame_bias
        )
    return statistics_chunked(
        q, k, frame_seq_length, num_q, lengths, scale, token_profiles=token_profiles, frame_bias=frame_bias
    )


def check_statistics(statistics: Sequence[str]) -> None:
    """Raise ValueError unless ``statistics`` names frame statistics, at least one, none twice."""
    if isinstance(statistics, str):
        raise ValueError(f"statistics must be a list of names, not the string {statistics!r}")
    unknown = [name for name in statistics if name not in FRAME_STATISTICS]
    if unknown or not statistics or len(set(statistics)) != len(statistics):
        raise ValueError(
            f"statistics {list(statistics)} must name each of {', '.join(FRAME_STATISTICS)} at most once, one at least"
        )


def check_frame_bias(frame_bias: torch.Tensor, heads: int, num_k: int) -> None:
    """Raise ValueError unless ``frame_bias`` is [heads, num_k] of finite values or -inf, with
    a key frame left to every head (read once per tensor: ``attention.biased.bias_rows``)."""
    check_bias_shape(frame_bias, heads, num_k)
    bias_rows(frame_bias)


def _resolve_backend(q: torch.Tensor, backend: str) -> str:
    """'triton' or 'torch': "auto" is Triton on CUDA where it runs, else torch."""
    if backend == "auto":
        return "triton" if q.is_cuda and triton_available() else "torch"
    if backend not in ("triton", "torch"):
        raise ValueError(f"unknown statistics backend {backend!r}; use 'auto', 'torch' or 'triton'")
    if backend == "triton" and not q.is_cuda:
        raise ValueError(f"the triton backend needs CUDA tensors; q is on {q.device} (use backend 'torch' or 'auto')")
    return backend


def fused_route_applies(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_lengths: Sequence[int], backend: str = "auto"
) -> bool:
    """Whether ``attention_with_statistics(..., fused=True)`` takes the one-pass Triton
    kernel (``attention_frame_partials_tma_kernel``) for q, k, v [H, L, D]: CUDA with the
    Triton backend, fp16 / bf16, every key frame at least a key tile long. Its output is
    SDPA's within bf16 rounding, not bit for bit: the only route whose video differs from
    the uncaptured one."""
    if _resolve_backend(q, backend) != "triton":
        return False
    from sinkscope.stats.launch import tma_kernel_fits

    return tma_kernel_fits(q, k, v, key_lengths)


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
    key_split: bool = True,
    frame_bias: torch.Tensor | None = None,
    frames: bool = False,
    statistics: Sequence[str] = FRAME_STATISTICS,
    attention_kernel: str = "auto",
) -> tuple[torch.Tensor, CallStatistics]:
    """The attention call itself and its statistics: (output [Lq, H, D] in q's dtype,
    :class:`CallStatistics`). Arguments as :func:`attention_statistics`, plus v [H, Lk, D].

    By default (the ``exact`` route) the output is the model's own cached call
    (``sinkscope.attention.split.cached_attention``, the keys split as ``key_split`` says,
    ``attention_kernel`` its kernel: ``KernelSettings.key_split`` and ``attention_kernel``),
    bit for bit on every device and dtype. Where that call is FlashAttention-4's on a Hopper
    GPU (``flash4_partials.one_pass_applies``), the same kernel, compiled with a softmax
    that keeps every key frame's partials, gives the output (the model's call's, bit for bit)
    and the statistics in one pass (``flash4_attention_partials``; ``fused`` takes it too where
    it applies); elsewhere the statistics
    come after the call from q and k (on CUDA given each query's log-sum-exp, which
    FlashAttention-4 and cuDNN return with the output: ``frame_partials_given_lse_kernel``;
    elsewhere the chunked reference, which recomputes the scores). With ``fused`` (config
    ``capture.attention: fused``) where ``fused_route_applies``:
    ``attention_frame_partials_tma_kernel``, a flash-attention forward in Triton that keeps
    every frame's partials as it goes, then ``frame_statistics_combine_kernel``
    (``attention_statistics_tma``): one pass, the output SDPA's within bf16 rounding. docs/performance.md compares them.

    ``frame_bias`` (an edited call, as :func:`attention_statistics` takes it): always the
    exact route, the output and log-sum-exp of ``sinkscope.attention.biased.edited_attention``
    (the model's own calls for the unedited heads, bit for bit), then the edited softmax's
    statistics given that log-sum-exp; ``fused`` and ``frames`` are ignored.

    ``frames`` (config ``capture.attention: frames``; every device and dtype): each key frame
    attended apart in one call and merged (``sinkscope.stats.segments.frame_attention``), the
    output within one rounding of the model's call; ``statistics`` must then be of
    ``FRAMES_ROUTE_STATISTICS`` (logit_mean, prob_mass), which it gives with no pass over the
    scores. ``statistics``: as :func:`attention_statistics`.
    """
    lengths = check_frame_layout(q, k, frame_seq_length, query_frames, key_frames, key_lengths, key_position_shift)
    if v.shape[:2] != k.shape[:2] or v.dtype != k.dtype or v.device != k.device:
        raise ValueError(f"v {tuple(v.shape)} ({v.dtype}, {v.device}) does not match k {tuple(k.shape)}")
    if scale is not None and scale != q.shape[-1] ** -0.5:
        raise ValueError(f"the model's attention call scales by 1/sqrt(head_dim) = {q.shape[-1] ** -0.5}, not {scale}")
    check_statistics(statistics)
    if frames and not set(statistics) <= set(FRAMES_ROUTE_STATISTICS):
        raise ValueError(
            f"the frames route gives {' and '.join(FRAMES_ROUTE_STATISTICS)} only, not {sorted(statistics)}: "
            "argmax_share and entropy need the scores (the exact or fused route)"
        )
    if frame_bias is not None:
        check_frame_bias(frame_bias, q.shape[0], len(lengths))
        out, lse = edited_attention(
            *(x.transpose(0, 1)[None] for x in (q, k, v)), frame_bias, lengths, split=key_split, kernel=attention_kernel
        )
        stats = attention_statistics(
            q,
            k,
            frame_seq_length=frame_seq_length,
            query_frames=query_frames,
            key_frames=key_frames,
            key_lengths=lengths,
            token_profiles=token_profiles,
            backend=backend,
            key_position_shift=key_position_shift,
            lse=lse[0],
            frame_bias=frame_bias,
            statistics=statistics,
        )
        return out[0], stats
    if frames:
        out, frame_lse, lse = frame_attention(q, k, v, lengths, kernel=attention_kernel)
        stats = statistics_from_frames(
            q,
            k,
            frame_lse,
            lse,
            frame_seq_length,
            len(query_frames),
            lengths,
            q.shape[-1] ** -0.5,
            statistics=statistics,
            token_profiles=token_profiles,
        )
        return out, stats
    # The attention call's own pass, where it gives every statistic: for `fused` as well
    # (faster than the Triton kernel, and the output stays the model's call's).
    if q.is_cuda:
        from sinkscope.stats.flash4_partials import (
            flash4_attention_partials,
            one_pass_applies,
            statistics_from_partials,
        )

        if one_pass_applies(q, k, v, lengths, statistics, attention_kernel, backend):
            scale = q.shape[-1] ** -0.5
            out, partials = flash4_attention_partials(
                q, k, v, lengths, scale, split=key_split, entropy="entropy" in statistics
            )
            stats = statistics_from_partials(
                q, k, partials, frame_seq_length, len(query_frames), lengths, scale, token_profiles=token_profiles
            )
            return out, keep_statistics(stats, statistics)
    if fused and fused_route_applies(q, k, v, lengths, backend):
        from sinkscope.stats.launch import attention_statistics_tma

        out, stats = attention_statistics_tma(
            q, k, v, frame_seq_length, len(query_frames), lengths, q.shape[-1] ** -0.5, token_profiles=token_profiles
        )
        return out, keep_statistics(stats, statistics)
    out, lse = cached_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), split=key_split, kernel=attention_kernel)
    stats = attention_statistics(
        q,
        k,
        frame_seq_length=frame_seq_length,
        query_frames=query_frames,
        key_frames=key_frames,
        key_lengths=lengths,
        token_profiles=token_profiles,
        backend=backend,
        key_position_shift=key_position_shift,
        lse=None if lse is None else lse[0],
        statistics=statistics,
    )
    return out[0], stats

"""Frame-level attention statistics of one self-attention call.

For a call with queries q [H, Lq, D] and the keys k [H, Lk, D] its softmax sees (post
RMSNorm and RoPE), tokens grouped ``frame_seq_length`` to a frame:

- ``logit_mean[h, qf, kf]``: the mean over every token pair of ``q_i . k_j * scale``.
  Exactly ``(mean of q over qf) . (mean of k over kf) * scale``, so it costs O(L D).
- ``prob_mass[h, qf, kf]``: the mean over query tokens of qf of the softmax mass (over
  all visible keys) that falls on the tokens of kf. It sums to 1 over kf.

Neither path materializes the Lq x Lk score matrix: the CPU reference streams over
query chunks within a fixed memory budget; the CUDA path is a Triton kernel that
streams over key tiles with a running max and sum per (query token, key frame), and
sums the raw scores on the way, so one pass over the keys gives both statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .reference import logit_mean_factorized, prob_mass_chunked

__all__ = ["frame_attention_stats", "check_frame_layout", "triton_available"]


def triton_available() -> bool:
    """True where the Triton kernel can run (a CUDA device and an importable triton)."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def check_frame_layout(
    q: torch.Tensor,
    k: torch.Tensor,
    frame_seq_length: int,
    query_frames: Sequence[int],
    key_frames: Sequence[int],
) -> None:
    """Raise ValueError unless q/k are [H, L, D] with L = frames x frame_seq_length."""
    if q.ndim != 3 or k.ndim != 3:
        raise ValueError(f"q and k must be [H, L, D]; got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in heads or head_dim")
    if q.device != k.device or q.dtype != k.dtype:
        raise ValueError(f"q ({q.dtype}, {q.device}) and k ({k.dtype}, {k.device}) differ in dtype or device")
    if frame_seq_length < 1:
        raise ValueError(f"frame_seq_length must be positive, got {frame_seq_length}")
    if q.shape[1] != len(query_frames) * frame_seq_length:
        raise ValueError(
            f"q has {q.shape[1]} tokens, not {len(query_frames)} query frames x {frame_seq_length}"
        )
    if k.shape[1] != len(key_frames) * frame_seq_length:
        raise ValueError(
            f"k has {k.shape[1]} tokens, not {len(key_frames)} key frames x {frame_seq_length}"
        )
    if len(set(key_frames)) != len(key_frames):
        raise ValueError(f"key_frames repeat a frame: {list(key_frames)}")


def frame_attention_stats(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    frame_seq_length: int,
    query_frames: Sequence[int],
    key_frames: Sequence[int],
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logit_mean, prob_mass), each float32 [H, len(query_frames), len(key_frames)].

    q [H, Lq, D] and k [H, Lk, D] hold the tokens of ``query_frames`` / ``key_frames``
    in order, ``frame_seq_length`` tokens each; the frame lists name absolute latent
    frames (they only label the result, the order of the axes is theirs). ``scale``
    defaults to D**-0.5. ``backend``: "auto" (Triton on CUDA when available, else
    torch), "torch" (the chunked reference, any device) or "triton".
    Results stay on q's device.
    """
    check_frame_layout(q, k, frame_seq_length, query_frames, key_frames)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    num_q, num_k = len(query_frames), len(key_frames)
    if backend == "auto":
        backend = "triton" if q.is_cuda and triton_available() else "torch"
    if backend == "triton":
        if not q.is_cuda:
            raise ValueError(f"the triton backend needs CUDA tensors; q is on {q.device} (use backend 'torch' or 'auto')")
        from .triton_kernels import frame_stats_triton

        logit_mean, prob_mass = frame_stats_triton(q, k, frame_seq_length, num_q, num_k, scale)
    elif backend == "torch":
        accumulate = torch.float64 if q.device.type == "cpu" else torch.float32
        logit_mean = logit_mean_factorized(q, k, num_q, num_k, scale, accumulate).float()
        prob_mass = prob_mass_chunked(q, k, frame_seq_length, num_q, num_k, scale)
    else:
        raise ValueError(f"unknown statistics backend {backend!r}; use 'auto', 'torch' or 'triton'")
    return logit_mean, prob_mass

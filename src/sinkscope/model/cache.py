"""The block-causal KV cache of Self-Forcing inference, at frame granularity.

Semantics follow Self-Forcing's ``CausalWanSelfAttention`` with a KV cache:

- keys are stored after q/k RMSNorm and RoPE (absolute temporal phase baked in);
- every model call covers one block; calling again with the same start frame (the
  next denoising step, or the cache pass) overwrites that block's slots in place;
- a call for the next block appends; when the cache is full and a window is set,
  the oldest non-sink frames are evicted and the rest shift left behind the
  ``sink_frames`` first frames, which never move;
- attention runs over every filled slot, the current block's own keys included.

The cache tracks the absolute frame index of every slot, so statistics can name key
frames by their place in the video, never by their place in the buffer.
"""

from __future__ import annotations

import torch


class KVCache:
    """Self-attention keys/values of every layer, plus the cross-attention K/V."""

    def __init__(
        self,
        *,
        num_layers: int,
        batch_size: int,
        num_heads: int,
        head_dim: int,
        frame_seq_length: int,
        capacity_frames: int,
        rolling: bool = False,
        sink_frames: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if capacity_frames < 1:
            raise ValueError(f"capacity_frames must be positive, got {capacity_frames}")
        if not 0 <= sink_frames < capacity_frames:
            raise ValueError(f"sink_frames must be in [0, {capacity_frames}), got {sink_frames}")
        self.num_layers = num_layers
        self.frame_seq_length = frame_seq_length
        self.capacity_frames = capacity_frames
        self.rolling = rolling
        self.sink_frames = sink_frames
        shape = (num_layers, batch_size, capacity_frames * frame_seq_length, num_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.cross: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        self.reset()

    def reset(self) -> None:
        """Forget every frame (buffers are overwritten, not zeroed, as in Self-Forcing)."""
        self.slot_frames: list[int] = []
        self.block_start: int | None = None
        self.block_frames = 0
        self.cross = [None] * self.num_layers

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    # -- per model call -------------------------------------------------------------

    def begin_call(self, start_frame: int, num_frames: int) -> None:
        """Place the block [start_frame, start_frame + num_frames) in the cache."""
        if self.block_start == start_frame:
            if num_frames != self.block_frames:
                raise ValueError(
                    f"block at frame {start_frame} was {self.block_frames} frames, now {num_frames}"
                )
            return
        expected = self.slot_frames[-1] + 1 if self.slot_frames else 0
        if start_frame != expected:
            raise ValueError(f"next block must start at frame {expected}, got {start_frame}")
        overflow = len(self.slot_frames) + num_frames - self.capacity_frames
        if overflow > 0:
            if not self.rolling:
                raise ValueError(
                    f"KV cache of {self.capacity_frames} frames is full at frame {start_frame}; "
                    "set a sliding window (local_attn_frames) to generate longer videos"
                )
            self._evict(overflow)
        self.slot_frames.extend(range(start_frame, start_frame + num_frames))
        self.block_start = start_frame
        self.block_frames = num_frames

    def _evict(self, num_frames: int) -> None:
        sink, used = self.sink_frames, len(self.slot_frames)
        if num_frames > used - sink:
            raise ValueError(
                f"window of {self.capacity_frames} frames with {sink} sink frames cannot hold "
                f"a block of {num_frames + self.capacity_frames - used} frames"
            )
        fsl = self.frame_seq_length
        src = slice((sink + num_frames) * fsl, used * fsl)
        dst = slice(sink * fsl, (used - num_frames) * fsl)
        # Overlapping ranges: copy through a temporary, once for every layer.
        self.k[:, :, dst] = self.k[:, :, src].clone()
        self.v[:, :, dst] = self.v[:, :, src].clone()
        del self.slot_frames[sink : sink + num_frames]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the current block's k/v [B, L, H, D] of ``layer``; return every visible k/v."""
        fsl = self.frame_seq_length
        end = len(self.slot_frames) * fsl
        start = end - self.block_frames * fsl
        self.k[layer, :, start:end] = k
        self.v[layer, :, start:end] = v
        return self.k[layer, :, :end], self.v[layer, :, :end]

    @property
    def query_frames(self) -> list[int]:
        return list(range(self.block_start, self.block_start + self.block_frames))

    @property
    def key_frames(self) -> list[int]:
        return list(self.slot_frames)

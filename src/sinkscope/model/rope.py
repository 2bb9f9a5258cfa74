"""Wan's rotary position embedding: the 3-axis tables (``RotaryTables``) and their rotation
of interleaved channel pairs (``apply_rope``), shared by the model and the cache policies
that move cached keys in time. ``sinkscope.model.wan`` re-exports both."""

from __future__ import annotations

from collections import OrderedDict

import torch


class RotaryTables:
    """Wan's 3-axis RoPE: head_dim split t:h:w = d-4(d//6) : 2(d//6) : 2(d//6), theta 1e4.

    Tables are computed in float64 from absolute positions; temporal positions start
    at the block's first frame (Self-Forcing's frame offset). ``max_positions`` is the
    model's own table (Wan: 1024 rows); positions past it are computed by the same
    formula, as the long-rollout methods that enlarge the table do (Rolling Sink: 8192),
    so rollouts are not limited to 1024 latent frames. Channel pairs
    (2i, 2i+1) rotate together (the interleaved convention). A few recent tables are
    kept on the device (a bounded LRU, so long rollouts do not grow device memory).
    """

    MEMO_SIZE = 8

    def __init__(self, head_dim: int, max_positions: int = 1024, theta: float = 10000.0) -> None:
        axis_t = head_dim - 4 * (head_dim // 6)
        axis_hw = 2 * (head_dim // 6)
        self.max_positions = max_positions
        self.axis_dims = (axis_t, axis_hw, axis_hw)
        self.theta = theta
        self._cache: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._temporal: dict[torch.device, torch.Tensor] = {}

    def _axis_angles(self, dim: int, positions: torch.Tensor) -> torch.Tensor:
        inv = 1.0 / torch.pow(self.theta, torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        return torch.outer(positions.to(torch.float64), inv)

    def phases(
        self, start_frame: int, frames: int, height: int, width: int, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        """(cos, sin) of every angle, [frames*height*width, 1, head_dim/2, 2], tokens in (f, h, w) order.

        Computed in float64; ``dtype`` is the real type returned (float32, or float64).
        """
        if start_frame < 0:
            raise ValueError(f"temporal positions {start_frame}..{start_frame + frames - 1} are negative")
        key = (start_frame, frames, height, width, torch.device(device), dtype)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        dt, dh, dw = self.axis_dims
        angle_t = self._axis_angles(dt, torch.arange(start_frame, start_frame + frames))
        angle_h = self._axis_angles(dh, torch.arange(height))
        angle_w = self._axis_angles(dw, torch.arange(width))
        angles = torch.cat(
            [
                angle_t[:, None, None, :].expand(frames, height, width, -1),
                angle_h[None, :, None, :].expand(frames, height, width, -1),
                angle_w[None, None, :, :].expand(frames, height, width, -1),
            ],
            dim=-1,
        ).reshape(frames * height * width, 1, -1)
        cached = torch.stack((angles.cos(), angles.sin()), dim=-1).to(dtype)
        device = torch.device(device)
        if device.type == "cuda":  # no host sync: the copy queues behind the running work
            cached = cached.pin_memory().to(device, non_blocking=True)
        else:
            cached = cached.to(device)
        self._cache[key] = cached
        while len(self._cache) > self.MEMO_SIZE:
            self._cache.popitem(last=False)
        return cached

    def temporal_angles(self, delta: int, device: torch.device) -> torch.Tensor:
        """delta x the temporal frequencies, float64 [axis_t / 2] on ``device``.

        Rotating the first axis_t channels of a roped key by these angles moves it from
        temporal position p to p + delta (what Deep Forcing's sink re-alignment does).
        """
        device = torch.device(device)
        inv = self._temporal.get(device)
        if inv is None:
            inv = self._temporal[device] = self._axis_angles(self.axis_dims[0], torch.ones(1))[0].to(device)
        return inv * float(delta)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved channel pairs (2i, 2i+1) of x [B, L, H, D] by the (cos, sin) of ``rope``."""
    pairs = x.to(rope.dtype).unflatten(-1, (-1, 2))
    if torch.compiler.is_compiling():
        # Real arithmetic: Inductor fuses it (it has no complex kernels).
        cos, sin = rope[..., 0], rope[..., 1]
        even, odd = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    else:
        # Eager: one complex multiply instead of six elementwise kernels.
        rotated = torch.view_as_real(torch.view_as_complex(pairs.contiguous()) * torch.view_as_complex(rope))
    return rotated.flatten(-2).to(x.dtype)

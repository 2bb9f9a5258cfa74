"""Rolling Forcing's cache: an un-roped anchor re-roped before the working cache, FIFO behind it."""

from __future__ import annotations

import torch

from sinkscope.model.cache import KVCache
from sinkscope.model.layout import AttentionLayout
from sinkscope.model.policies.base import (
    CachePolicy,
    register_policy,
)
from sinkscope.model.rope import RotaryTables, apply_rope
from sinkscope.options import (
    ROLLING_FORCING,
)


@register_policy
class RollingForcingPolicy(CachePolicy):
    """Rolling Forcing's KV cache and attention (RF ``wan/modules/causal_model.py`` 195-301).

    Calls come from ``sinkscope.generation.rolling``: a **window call** (several blocks
    at staggered noise levels, announced by ``begin_window``) or a **cache update** (the
    window's first block, clean, announced by ``begin_cache_update``). With L =
    ``window_frames`` (their ``max_attention_size``, 21 frames) and S = ``sink_frames``
    (the anchor = block 0 = their ``block_length``):

    - every call stores only the first block of its input (S frames): appended when new
      (FIFO eviction of the oldest frames after the anchor once the cache holds more than
      L + S frames), otherwise overwritten in place; block 0, the anchor, is stored
      **before RoPE**, every other block roped at its own frames;
    - window call starting at frame 0: the window's own keys only;
    - later window call at cs: the anchor roped at cs - working - S, the working cache
      (the held frames just before the window, at most L - F - S of them, F = the window's
      frames) at their own positions, then the window's keys: anchor | working | window
      sit contiguously in RoPE position;
    - cache update: the last L frames held (the block included); the anchor, when among
      them, at its original positions 0..S-1.
    """

    name = ROLLING_FORCING
    settings_keys = ("window_frames", "sink_frames")

    def __init__(
        self, cache: KVCache, *, window_frames: int, sink_frames: int, rope: RotaryTables | None = None
    ) -> None:
        if rope is None:
            raise ValueError(f"cache_policy {self.name!r} needs the model's RoPE tables")
        if sink_frames < 1 or window_frames < 2 * sink_frames or window_frames % sink_frames:
            raise ValueError(
                f"cache_policy {self.name!r} needs an attention span that is a multiple of the anchor's "
                f"{sink_frames} frames and holds two of them, got {window_frames}"
            )
        if cache.capacity_frames < window_frames + sink_frames:
            raise ValueError(
                f"a cache of {cache.capacity_frames} frames cannot hold the span of {window_frames} "
                f"frames plus the anchor of {sink_frames}"
            )
        self.window_frames = window_frames
        self.sink_frames = sink_frames
        super().__init__(cache, rope=rope)

    def reset(self) -> None:
        super().reset()
        self._announced: tuple[str, int, int] | None = None
        self.kind: str | None = None  # "window" or "update": the call running
        self.call_start = 0
        self.call_frames = 0
        self.anchor_position: int | None = None  # where this call attends the anchor (None: not attended)
        self._working: tuple[int, int] = (0, 0)  # token range of the working cache in the buffer
        self._slot = 0  # token offset of the stored block
        self._span = (0, 0)  # update calls: token range of the stored keys attended
        self._layout: AttentionLayout | None = None

    def begin_window(self, start_frame: int, num_frames: int) -> None:
        """The next model call is a window call over frames [start_frame, start_frame + num_frames)."""
        self._announced = ("window", int(start_frame), int(num_frames))

    def begin_cache_update(self, start_frame: int, num_frames: int) -> None:
        """The next model call re-encodes the clean block [start_frame, start_frame + num_frames)."""
        if num_frames != self.sink_frames:
            raise ValueError(f"a cache update re-encodes one block of {self.sink_frames} frames, not {num_frames}")
        self._announced = ("update", int(start_frame), int(num_frames))

    def begin_call(self, start_frame: int, num_frames: int, grid: tuple[int, int] | None = None) -> None:
        if grid is not None:
            self.grid = (int(grid[0]), int(grid[1]))
        if self._announced is None or self._announced[1:] != (start_frame, num_frames):
            raise ValueError(
                f"cache_policy {self.name!r}: a call of frames [{start_frame}, {start_frame + num_frames}) "
                f"that Rolling Forcing's procedure did not announce ({self._announced})"
            )
        if num_frames % self.sink_frames:
            raise ValueError(f"cache_policy {self.name!r}: a call holds whole blocks of {self.sink_frames} frames")
        self.kind, self._announced = self._announced[0], None
        self.call_start, self.call_frames = start_frame, num_frames
        self.block_start, self.block_frames = start_frame, self.sink_frames
        self._store_first_block(start_frame)
        self._plan()

    def _store_first_block(self, start: int) -> None:
        """Register the call's first block: a new block is appended (FIFO behind the anchor
        when full), a held one is overwritten by ``attend`` (RF: pointers move only when
        cache_end > global_end)."""
        fsl, size = self.frame_seq_length, self.sink_frames
        frames = self.cache.frames(0)
        end = frames[-1] + 1 if frames else 0
        if start == end:
            overflow = len(frames) + size - self.cache.capacity_frames
            if overflow > 0:
                self.cache.evict(overflow, after=self.sink_frames)
            self._append_block(start, size)
            frames = self.cache.frames(0)
        elif frames[-size:] != list(range(start, start + size)):
            raise ValueError(
                f"cache_policy {self.name!r}: a call's first block starts at frame {start}, but the cache "
                f"ends with frames {frames[-size:]}"
            )
        self._slot = (len(frames) - size) * fsl

    def _plan(self) -> None:
        """Which stored keys this call attends, at which positions, and its layout."""
        fsl, anchor = self.frame_seq_length, self.sink_frames
        held = self.cache.frames(0)
        query = range(self.call_start, self.call_start + self.call_frames)
        if self.kind == "window":
            if self.call_start == 0:
                # RF: a window starting at block 0 attends only to itself.
                self.anchor_position, self._working, keys = None, (0, 0), list(query)
                shifts = [0] * len(keys)
            else:
                before = [i for i, f in enumerate(held) if i >= anchor and f < self.call_start]
                count = max(0, min(len(before), self.window_frames - self.call_frames - anchor))
                chosen = before[len(before) - count :]
                self._working = (chosen[0] * fsl, (chosen[-1] + 1) * fsl) if chosen else (0, 0)
                self.anchor_position = self.call_start - count - anchor
                keys = [held[i] for i in range(anchor)] + [held[i] for i in chosen] + list(query)
                shifts = [self.anchor_position] * anchor + [0] * (count + len(query))
        else:
            first = max(0, len(held) - self.window_frames)
            if 0 < first < anchor:
                raise ValueError(f"cache_policy {self.name!r}: the update's span would split the anchor")
            self._span = (first * fsl, len(held) * fsl)
            self.anchor_position = 0 if first == 0 else None  # their original positions, or not attended
            keys, shifts = held[first:], [0] * (len(held) - first)
        self._layout = AttentionLayout.whole_frames(query, keys, fsl, shifts)

    @property
    def wants_raw_keys(self) -> bool:
        # Calls whose first block is block 0 store the anchor before RoPE.
        return self.kind is not None and self.call_start == 0

    @property
    def query_frames(self) -> tuple[int, ...]:
        return tuple(range(self.call_start, self.call_start + self.call_frames))

    def layout(self, layer: int) -> AttentionLayout:
        return self._layout

    def _roped_anchor(self, layer: int) -> torch.Tensor:
        if self.grid is None:
            raise ValueError("re-roping the anchor needs the latent grid (begin_call(..., grid=(h, w)))")
        dtype = torch.float64 if self.cache.dtype == torch.float64 else torch.float32
        phases = self.rope.phases(self.anchor_position, self.sink_frames, *self.grid, self.cache.device, dtype)
        return apply_rope(self.cache.k[layer, :, : self.sink_frames * self.frame_seq_length], phases)

    def attend(self, layer, q, k, v, raw_k=None):
        tokens = self.sink_frames * self.frame_seq_length
        if self.call_start == 0 and raw_k is None:
            raise ValueError("the anchor's calls need the keys before RoPE (raw_k)")
        stored = raw_k[:, :tokens] if self.call_start == 0 else k[:, :tokens]
        self.cache.write(layer, self._slot, stored, v[:, :tokens])
        ck, cv = self.cache.k[layer], self.cache.v[layer]
        if self.kind == "window":
            if self.anchor_position is None:
                return k, v
            lo, hi = self._working
            keys = torch.cat([self._roped_anchor(layer), ck[:, lo:hi], k], dim=1)
            return keys, torch.cat([cv[:, :tokens], cv[:, lo:hi], v], dim=1)
        lo, hi = self._span
        if self.anchor_position is None:
            return ck[:, lo:hi], cv[:, lo:hi]
        return torch.cat([self._roped_anchor(layer), ck[:, tokens:hi]], dim=1), cv[:, :hi]

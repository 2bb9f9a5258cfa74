"""Sink policies that move, re-insert or blend keys: Deep Forcing's deep sink, the re-roped
anchor, Rolling Sink, Infinity-RoPE's cache-relative RoPE and Reward Forcing's EMA sink."""

from __future__ import annotations

import numpy as np
import torch

from sinkscope.model.cache import KVCache, host_to_device, whole_frames
from sinkscope.model.policies.base import (
    EMA_DECAY,
    FLUSH_KEEP_FRAMES,
    SinkPolicy,
    WindowPolicy,
    register_policy,
)
from sinkscope.model.rope import RotaryTables, apply_rope
from sinkscope.options import (
    DEEP_SINK,
    EMA_SINK,
    RELATIVE_ROPE,
    REROPE_SINK,
    ROLLING_SINK,
)


def _first_frames_of_block(
    policy: SinkPolicy | RollingSinkPolicy, first_frames: int, raw_k: torch.Tensor | None, what: str
) -> tuple[slice, int]:
    """Where the current block's tokens that fall in the first ``first_frames`` frames go in
    a per-frame buffer, and how many there are; the block's keys before RoPE must be given."""
    if raw_k is None:
        raise ValueError(f"{what} need the keys before RoPE (raw_k)")
    fsl = policy.frame_seq_length
    tokens = (min(first_frames, policy.block_start + policy.block_frames) - policy.block_start) * fsl
    start = policy.block_start * fsl
    return slice(start, start + tokens), tokens


@register_policy
class DeepSinkPolicy(SinkPolicy):
    """Deep Forcing, Deep Sink only (DF ``causal_model_DS.py``).

    FIFO after the sink; on every rolling call (first call of an overflowing block) the
    stored, already-roped sink keys are rotated in place in their temporal channels, so
    that the sink starts at ``desired = cs - tail - S`` (cs: the block's start frame,
    tail: frames after the sink, = W - S with a full cache, so desired = cs - W). The first roll sets the
    base (delta 0); later rolls rotate by desired - base (cumulative, float64 math cast
    back to the cache dtype). The block's later calls reuse that position.
    """

    name = DEEP_SINK

    def reset(self) -> None:
        super().reset()
        self.sink_base: int | None = None

    def rolled(self, start: int, evicted: int) -> None:
        tail = self._held() - self.sink_frames
        desired = start - tail - self.sink_frames
        if self.sink_base is None:
            self.sink_base = desired
            return
        delta, self.sink_base = desired - self.sink_base, desired
        self._rotate_sink(self.sink_frames, delta)


@register_policy
class ReropeSinkPolicy(SinkPolicy):
    """Rolling Forcing's anchor (RF ``causal_model.py``) on Self-Forcing's block procedure.

    The first S frames are kept without RoPE (their normed keys) and, at each call, sit
    roped at [p0, p0 + S) with p0 = (oldest non-anchor frame held) - S: just before the
    working frames (p0 = 0 before any eviction). The roped copy lives in the anchor's
    slots and is redone only when p0 changes. The cache holds W frames.
    """

    name = REROPE_SINK

    def __init__(
        self, cache: KVCache, *, window_frames: int, sink_frames: int, rope: RotaryTables | None = None
    ) -> None:
        if rope is None:
            raise ValueError(f"cache_policy {self.name!r} needs the model's RoPE tables")
        shape = (cache.num_layers, *cache.k.shape[1:2], sink_frames * cache.frame_seq_length, *cache.k.shape[3:])
        self.raw_anchor = torch.zeros(shape, dtype=cache.dtype, device=cache.device)
        super().__init__(cache, window_frames=window_frames, sink_frames=sink_frames, rope=rope)

    def reset(self) -> None:
        super().reset()
        self.anchor_position = 0

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.raw_anchor.numel() * self.raw_anchor.element_size()

    @property
    def wants_raw_keys(self) -> bool:
        return self.block_start is not None and self.block_start < self.sink_frames

    def attend(self, layer, q, k, v, raw_k=None):
        if self.block_start < self.sink_frames:
            # This block writes anchor frames: keep them un-roped. Nothing was evicted
            # yet (p0 = 0), so the roped keys stored below sit at the anchor's position.
            place, tokens = _first_frames_of_block(self, self.sink_frames, raw_k, "the anchor's blocks")
            self.raw_anchor[layer, :, place] = raw_k[:, :tokens]
        return super().attend(layer, q, k, v, raw_k)

    def start_block(self, start: int, frames: int) -> None:
        super().start_block(start, frames)
        segs = self.cache.segments_of(0)
        working = segs[self.sink_frames :]
        p0 = working[0].frame - self.sink_frames if working else 0
        if p0 != self.anchor_position:
            self._rerope_anchor(p0)

    def _rerope_anchor(self, p0: int) -> None:
        if self.grid is None:
            raise ValueError("re-roping the anchor needs the latent grid (begin_call(..., grid=(h, w)))")
        dtype = torch.float64 if self.cache.dtype == torch.float64 else torch.float32
        phases = self.rope.phases(p0, self.sink_frames, *self.grid, self.cache.device, dtype)
        for layer in range(self.cache.num_layers):
            self.cache.write(layer, 0, apply_rope(self.raw_anchor[layer], phases))
        self.cache.set_positions(0, self.sink_frames, [p0 + i for i in range(self.sink_frames)])
        self.anchor_position = p0


@register_policy
class RollingSinkPolicy(WindowPolicy):
    """Rolling Sink (RS ``wan/modules/causal_model.py`` 233-281) on Self-Forcing's block procedure.

    A FIFO window of W frames without a fixed sink (the reference runs ``sink_size`` 0);
    keys are stored post-RoPE at their own positions. The keys before RoPE and the values
    of the first R = W - S frames are kept aside (S = ``sink_frames``, the segment). Once
    a block [cs, cs + b) ends at or past W + S, after its last call (the cache pass), the
    S slots just before it, positions cs - S .. cs - 1, are overwritten by first-window
    frames roped at those positions: position p gets frame ``frame_at(p)``, the sweep
    forward then back over frames 0 .. R - 1 (p mod R on even passes p // R, R - 1 -
    p mod R on odd ones). The reference's own formula (a segment start ``left`` per block,
    frames reversed on odd passes) equals it wherever the reference runs (b = S = 3, W a
    multiple of 3); it is done here when the next block starts, before its eviction,
    which no call in between can tell apart.
    """

    name = ROLLING_SINK
    settings_keys = ("window_frames", "sink_frames")

    def __init__(
        self, cache: KVCache, *, window_frames: int, sink_frames: int, rope: RotaryTables | None = None
    ) -> None:
        if rope is None:
            raise ValueError(f"cache_policy {self.name!r} needs the model's RoPE tables")
        if not 1 <= sink_frames < window_frames:
            raise ValueError(
                f"cache_policy {self.name!r} needs 1 <= sink_frames < window_frames, got {sink_frames}, {window_frames}"
            )
        self.segment_frames = sink_frames
        self.sweep_frames = window_frames - sink_frames
        shape = (cache.num_layers, cache.batch_size, self.sweep_frames * cache.frame_seq_length, *cache.k.shape[3:])
        self.raw_k = torch.zeros(shape, dtype=cache.dtype, device=cache.device)
        self.raw_v = torch.zeros(shape, dtype=cache.dtype, device=cache.device)
        super().__init__(cache, window_frames=window_frames, sink_frames=0, rope=rope)

    def reset(self) -> None:
        super().reset()
        self.previous: tuple[int, int] | None = None

    @property
    def nbytes(self) -> int:
        return super().nbytes + 2 * self.raw_k.numel() * self.raw_k.element_size()

    def frame_at(self, position: int) -> int:
        """The first-window frame re-inserted at temporal position ``position``."""
        sweep, offset = divmod(position, self.sweep_frames)
        return offset if sweep % 2 == 0 else self.sweep_frames - 1 - offset

    @property
    def wants_raw_keys(self) -> bool:
        return self.block_start is not None and self.block_start < self.sweep_frames

    def attend(self, layer, q, k, v, raw_k=None):
        if self.block_start < self.sweep_frames:
            # This block writes first-window frames: keep their keys before RoPE and their
            # values (every call; the cache pass writes last, as the reference's k_original).
            place, tokens = _first_frames_of_block(self, self.sweep_frames, raw_k, "the first window's blocks")
            self.raw_k[layer, :, place] = raw_k[:, :tokens]
            self.raw_v[layer, :, place] = v[:, :tokens]
        return super().attend(layer, q, k, v, raw_k)

    def start_block(self, start: int, frames: int) -> None:
        if self.previous is not None:
            before, size = self.previous
            if before + size - self.segment_frames >= self.window_frames:
                self._reinsert(before - self.segment_frames)
        super().start_block(start, frames)
        self.previous = (start, frames)

    def _reinsert(self, position: int) -> None:
        """Overwrite the slots at positions [position, position + S) with first-window frames."""
        if self.grid is None:
            raise ValueError("re-inserting roped keys needs the latent grid (begin_call(..., grid=(h, w)))")
        fsl, count = self.frame_seq_length, self.segment_frames
        segs = self.cache.segments_of(0)
        slot = position - segs[0].position
        if [s.position for s in segs] != list(range(segs[0].position, segs[0].position + len(segs))) or not (
            0 <= slot <= len(segs) - count
        ):
            raise ValueError(f"rolling_sink: no slots at positions {position}..{position + count - 1} in {segs}")
        frames = [self.frame_at(position + i) for i in range(count)]
        index = host_to_device((np.asarray(frames)[:, None] * fsl + np.arange(fsl)).ravel(), self.cache.device)
        dtype = torch.float64 if self.cache.dtype == torch.float64 else torch.float32
        phases = self.rope.phases(position, count, *self.grid, self.cache.device, dtype)
        for layer in range(self.cache.num_layers):
            roped = apply_rope(self.raw_k[layer][:, index], phases)
            self.cache.write(layer, slot * fsl, roped, self.raw_v[layer][:, index])
        self.cache.relabel(slot, whole_frames(frames, fsl, positions=range(position, position + count)))


class RelativeRope:
    """The relative-RoPE part of a window policy, mixed in before it (Infinity-RoPE's
    ``relative_rope``, Reward Forcing's ``ema_sink``, LongLive 2.0's ``use_relative_rope``).

    The cache holds the keys before RoPE; at every call each key is roped at its slot in
    the cache (0 .. n - 1, the block's too) and the queries at the block's slots (the last
    ones; ``query_position_shift``), so no position grows past the cache however long the
    video. The window policy it joins decides what the cache keeps.
    """

    raw_keys_every_call = True

    def __init__(self, cache: KVCache, *, rope: RotaryTables | None = None, **window) -> None:
        if rope is None:
            raise ValueError(f"cache_policy {self.name!r} needs the model's RoPE tables")
        super().__init__(cache, rope=rope, **window)

    @property
    def wants_raw_keys(self) -> bool:
        return True

    @property
    def query_position_shift(self) -> int:
        if self.block_start is None:
            return 0
        return self._held() - self.block_frames - self.block_start

    def start_block(self, start: int, frames: int) -> None:
        super().start_block(start, frames)
        held = self._held()
        self.cache.set_positions(0, held, list(range(held)))

    def attend(self, layer, q, k, v, raw_k=None):
        if raw_k is None:
            raise ValueError(f"cache_policy {self.name!r} stores the keys before RoPE (raw_k)")
        keys, values = super().attend(layer, q, raw_k, v, raw_k)
        # Every key roped at its slot 0 .. n - 1.
        dtype = torch.float64 if keys.dtype == torch.float64 else torch.float32
        phases = self.rope.phases(0, keys.shape[1] // self.frame_seq_length, *self.grid, keys.device, dtype)
        return apply_rope(keys, phases), values


@register_policy
class RelativeRopePolicy(RelativeRope, SinkPolicy):
    """Infinity-RoPE's block-relativistic RoPE (IR ``wan/modules/causal_model.py`` 224-296).

    The cache holds W frames' keys before RoPE: the S sink frames, never evicted, then
    FIFO; each key roped at its slot at every call (``RelativeRope``), the queries at
    their code's ``relative_start_frame``: W - b on the call that evicted, else cs below
    W, else W - b; that is the block's own slots (the last ones) whenever the blocks
    divide W and no flush left the cache short. The reference stores its global sink
    (slot 0) roped at position 0, which is the same key.

    ``flush_every_blocks`` (0: never): Infinity-RoPE's KV flush, which their pipeline runs
    when the prompt changes (a scene boundary), before every block whose index is a
    positive multiple of it: the cache keeps the sink and the ``FLUSH_KEEP_FRAMES`` most
    recent frames. sinkscope has one prompt a video, so its default never flushes.
    """

    name = RELATIVE_ROPE
    settings_keys = ("window_frames", "sink_frames", "flush_every_blocks")

    def __init__(
        self,
        cache: KVCache,
        *,
        window_frames: int,
        sink_frames: int,
        rope: RotaryTables | None = None,
        flush_every_blocks: int = 0,
    ) -> None:
        if flush_every_blocks < 0:
            raise ValueError(f"flush_every_blocks must be 0 (never) or positive, got {flush_every_blocks}")
        self.flush_every_blocks = flush_every_blocks
        super().__init__(cache, window_frames=window_frames, sink_frames=sink_frames, rope=rope)

    def reset(self) -> None:
        super().reset()
        self.blocks_started = 0
        self.flushes = 0
        self.evicted_now = False

    @property
    def query_position_shift(self) -> int:
        if self.block_start is None:
            return 0
        window, frames, start = self.window_frames, self.block_frames, self.block_start
        if self.evicted_now or start >= window:
            return window - frames - start
        return 0

    def start_block(self, start: int, frames: int) -> None:
        every = self.flush_every_blocks
        if every and self.blocks_started and self.blocks_started % every == 0:
            self._flush()
        self.evicted_now = self._held() + frames > self.window_frames
        super().start_block(start, frames)
        self.blocks_started += 1

    def repeat_call(self) -> None:
        self.evicted_now = False

    def _flush(self) -> None:
        """Infinity-RoPE's KV flush: the sink and the most recent frames stay."""
        held = self._held()
        drop = held - self.sink_frames - FLUSH_KEEP_FRAMES
        if drop > 0:
            self.cache.evict(drop, after=self.sink_frames)
        self.flushes += 1


@register_policy
class EmaSinkPolicy(RelativeRope, SinkPolicy):
    """Reward Forcing's EMA sink (RwF ``wan/modules/causal_model.py`` 88-108, 142-256).

    Keys before RoPE, roped at their cache slot at every call, queries at the block's
    slots (their ``query_start_frame``; ``RelativeRope``). On the first call of a block
    that overflows W frames, the oldest frames after the S sink frames are evicted (FIFO)
    and, when they are exactly S frames, blended token by token into the sink, keys and
    values before RoPE: sink <- a sink + (1 - a) evicted (a = ``ema_decay``, 0.999), in
    the cache dtype as their code computes it. When the evicted frames are not S frames
    (blocks other than S frames, e.g. an independent first frame), their code replaces
    the first of the sink's frames by the evicted ones instead; so does this.

    ``key_frame`` of a sink slot names the frame that last wrote it whole (frame i of the
    first S frames, or an evicted frame that replaced it): after n blends it holds a^n of
    that frame and (1 - a) a^(n - j) of the frame evicted at the j-th blend.
    """

    name = EMA_SINK
    settings_keys = ("window_frames", "sink_frames", "ema_decay")

    def __init__(
        self,
        cache: KVCache,
        *,
        window_frames: int,
        sink_frames: int,
        rope: RotaryTables | None = None,
        ema_decay: float = EMA_DECAY,
    ) -> None:
        if not 0.0 <= ema_decay <= 1.0:
            raise ValueError(f"ema_decay must be in [0, 1], got {ema_decay}")
        self.ema_decay = float(ema_decay)
        super().__init__(cache, window_frames=window_frames, sink_frames=sink_frames, rope=rope)

    def reset(self) -> None:
        super().reset()
        self.blends = 0
        self.replacements = 0

    def start_block(self, start: int, frames: int) -> None:
        held, sink, fsl = self._held(), self.sink_frames, self.frame_seq_length
        overflow = held + frames - self.window_frames
        evicted = None
        if 0 < overflow <= held - sink:
            span = slice(sink * fsl, (sink + overflow) * fsl)
            labels = [s.frame for s in self.cache.segments_of(0)[sink : sink + overflow]]
            evicted = (self.cache.k[:, :, span].clone(), self.cache.v[:, :, span].clone(), labels)
        super().start_block(start, frames)  # evicts, appends, sets the slots' positions
        if evicted is not None:
            self._absorb(*evicted)

    def _absorb(self, k: torch.Tensor, v: torch.Tensor, labels: list[int]) -> None:
        fsl, sink = self.frame_seq_length, self.sink_frames
        if len(labels) == sink:
            a = self.ema_decay
            tokens = slice(0, sink * fsl)
            self.cache.k[:, :, tokens] = a * self.cache.k[:, :, tokens] + (1 - a) * k
            self.cache.v[:, :, tokens] = a * self.cache.v[:, :, tokens] + (1 - a) * v
            self.blends += 1
            return
        count = min(len(labels), sink)
        self.cache.k[:, :, : count * fsl] = k[:, :, : count * fsl]
        self.cache.v[:, :, : count * fsl] = v[:, :, : count * fsl]
        self.cache.relabel(0, whole_frames(labels[:count], fsl, positions=range(count)))
        self.replacements += 1

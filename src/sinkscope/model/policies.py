"""KV-cache policies of long-video generation: what the cache keeps, and at which RoPE position.

Each policy is one small class around a policy-free ``KVCache`` (``model/cache.py``).
The model calls it twice per self-attention call:

- ``begin_call(start_frame, num_frames)``, once per model call, before the layers run:
  block bookkeeping, and everything that is the same for every layer (make room, FIFO
  eviction, moving sink keys to another RoPE position);
- ``attend(layer, q, k, v, raw_k)``, per layer: store the block's keys (first call of
  the block, or an overwrite by a later step / the cache pass), do what needs this
  layer's queries (participative compression), and return every key/value the softmax
  sees. ``layout(layer)`` names them by absolute frame (for attention observers).

Self-Forcing's block procedure (its ``causal_inference.py``): per block, one call per
denoising step and one cache pass, all with the same start frame; the first call of a
new block is the only one that evicts or compresses. Queries and new keys are always
roped at their absolute frame. What each policy does, and where it follows which
reference code, is in docs/cache-policies.md.

=============================  ======================================================
policy                         class
=============================  ======================================================
``global``                     ``GlobalPolicy``: every frame stays
``window``                     ``WindowPolicy``: FIFO eviction of whole frames
``sink``                       ``SinkPolicy``: FIFO behind the first S frames
``deep_sink``                  ``DeepSinkPolicy``: + sink keys rotated in place (Deep Forcing DS)
``participative_compression``  ``ParticipativeCompressionPolicy`` (Deep Forcing DS + PC)
``rerope_sink``                ``ReropeSinkPolicy``: un-roped anchor (Rolling Forcing)
``rolling_sink``               ``RollingSinkPolicy``: first-window frames re-inserted (Rolling Sink)
``relative_rope``              ``RelativeRopePolicy``: keys roped at their cache slot (Infinity-RoPE)
``ema_sink``                   ``EmaSinkPolicy``: + evicted frames blended into the sink (Reward Forcing)
``rolling_forcing``            ``RollingForcingPolicy``: Rolling Forcing's own calls (its rolling window)
=============================  ======================================================

``RollingForcingPolicy`` does not follow the block procedure: its calls are Rolling
Forcing's window and cache-update calls (``sinkscope.generation.rolling``), each announced
by ``begin_window`` / ``begin_cache_update``.

Queries are roped at their absolute frame, except under the cache-relative policies
(``relative_rope``, ``ema_sink``): there the cache holds keys before RoPE, every key is
roped at its slot in the cache at each call, and the queries at the block's slots
(``query_position_shift``), so no position grows past the cache.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch

from sinkscope.model.cache import KVCache, host_to_device, whole_frames
from sinkscope.model.layout import AttentionLayout
from sinkscope.model.wan import RotaryTables, WanModel, apply_rope
from sinkscope.options import (
    CACHE_POLICY_TABLE,
    DEEP_SINK,
    EMA_SINK,
    GLOBAL,
    PARTICIPATIVE,
    RELATIVE_ROPE,
    REROPE_SINK,
    ROLLING_FORCING,
    ROLLING_SINK,
    SINK,
    WINDOW,
    GenerationOptions,
)

# Deep Forcing's PC_topc_max_reuse (DF causal_model.py: CausalWanModel's default, which
# their wrapper cannot change): a token may be selected as top-C this many times; after
# that it is no longer a candidate and leaves the cache at the next compression.
MAX_REUSE = 7
# Reward Forcing's compression_alpha (RwF causal_model.py: CausalWanSelfAttention's
# default, which neither their model nor their config changes): sink <- a sink + (1 - a) evicted.
EMA_DECAY = 0.999
# Infinity-RoPE's KV flush keeps the sink and this many most recent frames (IR
# pipeline/causal_inference.py kv_flush: slots 1..2 <- the buffer's last 3120 tokens).
FLUSH_KEEP_FRAMES = 2


class CachePolicy:
    """Self-Forcing's block bookkeeping; subclasses decide how a new block gets room."""

    name: ClassVar[str] = ""
    # Whether the cache size is independent of the video length.
    bounded: ClassVar[bool] = True
    # Whether every call wants the block's keys before RoPE (``wants_raw_keys``).
    raw_keys_every_call: ClassVar[bool] = False

    def __init__(self, cache: KVCache, *, rope: RotaryTables | None = None) -> None:
        self.cache = cache
        self.rope = rope
        self.frame_seq_length = cache.frame_seq_length
        self.grid: tuple[int, int] | None = None
        self.reset()

    def reset(self) -> None:
        """Start a new video (a fresh cache; Deep Forcing's pipeline forgets to, see the doc)."""
        self.cache.reset()
        self.block_start: int | None = None
        self.block_frames = 0
        self.new_block = False
        # (first frame, frames) of the re-cache call announced, and of the one running.
        self._pending_recache: tuple[int, int] | None = None
        self.recaching: tuple[int, int] | None = None

    # -- per model call ------------------------------------------------------------------

    def begin_recache(self, start_frame: int, num_frames: int) -> None:
        """The next model call recomputes the generated frames [start_frame, start_frame +
        num_frames) under a new prompt (LongLive's KV re-cache at a prompt switch).

        That call overwrites the keys/values of the frames it holds among them, in place,
        except the sink frames when the range does not start at frame 0 (LongLive's
        recompute never writes the sink's slots; a range from frame 0 rewrites them too);
        it attends every held frame, the rewritten ones with their new keys, bidirectionally.
        Its frames not held (evicted ones) are computed as queries only. No block
        bookkeeping changes: the next block starts where the last one ended.
        """
        if not CACHE_POLICY_TABLE[self.name].recaches:
            raise ValueError(f"cache_policy {self.name!r} cannot re-cache (its cache holds keys that moved)")
        if self.block_start is None:
            raise ValueError("nothing to re-cache before the first block")
        end = self.block_start + self.block_frames
        if num_frames < 1 or start_frame < 0 or start_frame + num_frames != end:
            raise ValueError(f"a re-cache recomputes frames ending at the last generated frame {end - 1}, "
                             f"not [{start_frame}, {start_frame + num_frames})")  # fmt: skip
        self._pending_recache = (int(start_frame), int(num_frames))

    def begin_call(self, start_frame: int, num_frames: int, grid: tuple[int, int] | None = None) -> None:
        """A model call for frames [start_frame, start_frame + num_frames) begins."""
        if grid is not None:
            self.grid = (int(grid[0]), int(grid[1]))
        self.recaching = None
        if self._pending_recache is not None:
            if self._pending_recache != (start_frame, num_frames):
                raise ValueError(f"re-cache of frames {self._pending_recache} announced, the call is {(start_frame, num_frames)}")
            self.recaching, self._pending_recache = self._pending_recache, None
            self.new_block = False
            return
        if self.block_start == start_frame:
            if num_frames != self.block_frames:
                raise ValueError(f"block at frame {start_frame} was {self.block_frames} frames, now {num_frames}")
            self.new_block = False
            self.repeat_call()
            return
        expected = 0 if self.block_start is None else self.block_start + self.block_frames
        if start_frame != expected:
            raise ValueError(f"next block must start at frame {expected}, got {start_frame}")
        self.block_start, self.block_frames, self.new_block = start_frame, num_frames, True
        self.start_block(start_frame, num_frames)

    def start_block(self, start: int, frames: int) -> None:
        raise NotImplementedError

    def repeat_call(self) -> None:
        """A later call of the current block (next denoising step or the cache pass)."""

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, raw_k: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the block's roped k/v [B, L, H, D] of ``layer``; return every key/value the softmax sees."""
        if self.recaching is not None:
            self._rewrite(layer, k, v)
        else:
            self.cache.write_tail(layer, k, v)
        return self.cache.keys(layer)

    def _rewrite(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """The re-cache call: overwrite the held frames of its range with its keys/values
        (roped at their own frames, as stored), the sink kept unless the range starts at 0."""
        start, count = self.recaching
        fsl = self.frame_seq_length
        protected = getattr(self, "sink_frames", 0) if start > 0 else 0
        offset = 0
        for segment in self.cache.segments_of(layer):
            if start <= segment.frame < start + count and segment.frame >= protected:
                if not segment.whole or segment.shift != 0:
                    raise ValueError(f"cache_policy {self.name!r}: frame {segment.frame} is not held whole at its own position")
                source = (segment.frame - start) * fsl
                self.cache.write(layer, offset, k[:, source : source + fsl], v[:, source : source + fsl])
            offset += segment.length

    @property
    def wants_raw_keys(self) -> bool:
        """Whether this call's ``attend`` needs the block's keys before RoPE too."""
        return False

    @property
    def query_position_shift(self) -> int:
        """Temporal RoPE position of this call's queries (and new keys) minus their frames."""
        return 0

    def layout(self, layer: int) -> AttentionLayout:
        return self.cache.layout(layer, self.query_frames, self.query_position_shift)

    # -- reading -----------------------------------------------------------------------

    @property
    def query_frames(self) -> tuple[int, ...]:
        if self.recaching is not None:
            return tuple(range(self.recaching[0], self.recaching[0] + self.recaching[1]))
        return tuple(range(self.block_start, self.block_start + self.block_frames))

    @property
    def key_frames(self) -> list[int]:
        """Frames held by layer 0 (every layer, except under participative compression)."""
        return self.cache.frames(0)

    @property
    def nbytes(self) -> int:
        """Device bytes of everything the policy keeps (K/V buffers and extras)."""
        return self.cache.nbytes

    # -- helpers -----------------------------------------------------------------------

    def _held(self) -> int:
        return len(self.cache.segments_of(0))

    def _append_block(self, start: int, frames: int) -> None:
        self.cache.append(whole_frames(range(start, start + frames), self.frame_seq_length))

    def _rotate_sink(self, count: int, delta: int, layers=None) -> None:
        """Deep Forcing's ``_rope_time_delta_mul_``: rotate the first ``count`` frames by delta."""
        if delta == 0 or count == 0:
            return
        if self.rope is None:
            raise ValueError(f"cache_policy {self.name!r} needs the model's RoPE tables")
        layers_list = range(self.cache.num_layers) if layers is None else layers
        for layer in layers_list:
            positions = [s.position + delta for s in self.cache.segments_of(layer)[:count]]
            if min(positions) < 0:
                raise ValueError(
                    f"cache_policy {self.name!r}: sink keys would move to negative temporal positions {min(positions)}"
                )
        self.cache.rotate(0, count, delta, self.rope.temporal_angles(delta, self.cache.device), layers)


class GlobalPolicy(CachePolicy):
    """Every frame stays (Self-Forcing with ``local_attn_size = -1``); the cache grows with the video."""

    name = GLOBAL
    bounded = False

    def start_block(self, start: int, frames: int) -> None:
        if self._held() + frames > self.cache.capacity_frames:
            raise ValueError(
                f"KV cache of {self.cache.capacity_frames} frames is full at frame {start}; "
                "set a sliding window (local_attn_frames) or a bounded cache_policy to generate longer videos"
            )
        self._append_block(start, frames)


class WindowPolicy(CachePolicy):
    """Self-Forcing ``local_attn_size`` (W frames held, the current block included).

    On the first call of a block that would overflow W frames, the oldest frames after
    the first ``sink_frames`` are evicted (FIFO) and the rest moves left; keys keep the
    RoPE phase of the position they were generated at.
    """

    name = WINDOW

    def __init__(self, cache: KVCache, *, window_frames: int, sink_frames: int = 0, rope: RotaryTables | None = None) -> None:
        if not 0 <= sink_frames < window_frames:
            raise ValueError(f"sink_frames must be in [0, {window_frames}), got {sink_frames}")
        if cache.capacity_frames < window_frames:
            raise ValueError(f"a cache of {cache.capacity_frames} frames cannot hold a window of {window_frames}")
        self.window_frames = window_frames
        self.sink_frames = sink_frames
        super().__init__(cache, rope=rope)

    def start_block(self, start: int, frames: int) -> None:
        held, sink, window = self._held(), self.sink_frames, self.window_frames
        overflow = held + frames - window
        if overflow > 0:
            if overflow > held - sink:
                raise ValueError(
                    f"window of {window} frames with {sink} sink frames cannot hold a block of {frames} frames"
                )
            self.cache.evict(overflow, after=sink)
        self._append_block(start, frames)
        if overflow > 0:
            self.rolled(start)

    def rolled(self, start: int) -> None:
        """Hook: frames were evicted for the block starting at ``start`` (already appended)."""


class SinkPolicy(WindowPolicy):
    """Self-Forcing ``sink_size`` / LongLive's frame sink: the first S frames are never evicted.

    Attention: the S sink frames at their own positions + the last W - S frames.
    """

    name = SINK

    def __init__(self, cache: KVCache, *, window_frames: int, sink_frames: int, rope: RotaryTables | None = None) -> None:
        if sink_frames < 1:
            raise ValueError(f"cache_policy {self.name!r} needs sink_frames >= 1, got {sink_frames}")
        super().__init__(cache, window_frames=window_frames, sink_frames=sink_frames, rope=rope)


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

    def rolled(self, start: int) -> None:
        tail = self._held() - self.sink_frames
        desired = start - tail - self.sink_frames
        if self.sink_base is None:
            self.sink_base = desired
            return
        delta, self.sink_base = desired - self.sink_base, desired
        self._rotate_sink(self.sink_frames, delta)


class ReropeSinkPolicy(SinkPolicy):
    """Rolling Forcing's anchor (RF ``causal_model.py``) on Self-Forcing's block procedure.

    The first S frames are kept without RoPE (their normed keys) and, at each call, sit
    roped at [p0, p0 + S) with p0 = (oldest non-anchor frame held) - S: just before the
    working frames (p0 = 0 before any eviction). The roped copy lives in the anchor's
    slots and is redone only when p0 changes. The cache holds W frames.
    """

    name = REROPE_SINK

    def __init__(self, cache: KVCache, *, window_frames: int, sink_frames: int, rope: RotaryTables | None = None) -> None:
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
            if raw_k is None:
                raise ValueError("the anchor's blocks need the keys before RoPE (raw_k)")
            fsl = self.frame_seq_length
            frames = min(self.sink_frames, self.block_start + self.block_frames) - self.block_start
            start = self.block_start * fsl
            self.raw_anchor[layer, :, start : start + frames * fsl] = raw_k[:, : frames * fsl]
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

    def __init__(self, cache: KVCache, *, window_frames: int, sink_frames: int, rope: RotaryTables | None = None) -> None:
        if rope is None:
            raise ValueError(f"cache_policy {self.name!r} needs the model's RoPE tables")
        if not 1 <= sink_frames < window_frames:
            raise ValueError(f"cache_policy {self.name!r} needs 1 <= sink_frames < window_frames, got {sink_frames}, {window_frames}")
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
            if raw_k is None:
                raise ValueError("the first window's blocks need the keys before RoPE (raw_k)")
            fsl = self.frame_seq_length
            tokens = (min(self.sweep_frames, self.block_start + self.block_frames) - self.block_start) * fsl
            start = self.block_start * fsl
            self.raw_k[layer, :, start : start + tokens] = raw_k[:, :tokens]
            self.raw_v[layer, :, start : start + tokens] = v[:, :tokens]
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


class RelativeRopePolicy(SinkPolicy):
    """Infinity-RoPE's block-relativistic RoPE (IR ``wan/modules/causal_model.py`` 224-296).

    The cache holds W frames' keys before RoPE: the S sink frames, never evicted, then
    FIFO. At every call each key is roped at its slot in the cache (0 .. W - 1) and the
    queries at their code's ``relative_start_frame``: W - b on the call that evicted,
    else cs below W, else W - b; that is the block's own slots (the last ones) whenever
    the blocks divide W and no flush left the cache short. No position reaches past
    W - 1, however long the video. The reference stores its global sink (slot 0) roped
    at position 0, which is the same key.

    ``flush_every_blocks`` (0: never): Infinity-RoPE's KV flush, which their pipeline runs
    when the prompt changes (a scene boundary), before every block whose index is a
    positive multiple of it: the cache keeps the sink and the ``FLUSH_KEEP_FRAMES`` most
    recent frames. sinkscope has one prompt a video, so its default never flushes.
    """

    name = RELATIVE_ROPE
    raw_keys_every_call = True

    def __init__(
        self,
        cache: KVCache,
        *,
        window_frames: int,
        sink_frames: int,
        rope: RotaryTables | None = None,
        flush_every_blocks: int = 0,
    ) -> None:
        if rope is None:
            raise ValueError(f"cache_policy {self.name!r} needs the model's RoPE tables")
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
    def wants_raw_keys(self) -> bool:
        return True

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
        held = self._held()
        self.cache.set_positions(0, held, list(range(held)))

    def repeat_call(self) -> None:
        self.evicted_now = False

    def _flush(self) -> None:
        """Infinity-RoPE's KV flush: the sink and the most recent frames stay."""
        held = self._held()
        drop = held - self.sink_frames - FLUSH_KEEP_FRAMES
        if drop > 0:
            self.cache.evict(drop, after=self.sink_frames)
        self.flushes += 1

    def attend(self, layer, q, k, v, raw_k=None):
        if raw_k is None:
            raise ValueError(f"cache_policy {self.name!r} stores the keys before RoPE (raw_k)")
        self.cache.write_tail(layer, raw_k, v)
        stored_k, stored_v = self.cache.keys(layer)
        # Every key at its slot 0 .. n - 1 (the block's too: the queries may sit elsewhere).
        dtype = torch.float64 if self.cache.dtype == torch.float64 else torch.float32
        phases = self.rope.phases(0, stored_k.shape[1] // self.frame_seq_length, *self.grid, self.cache.device, dtype)
        return apply_rope(stored_k, phases), stored_v


class EmaSinkPolicy(RelativeRopePolicy):
    """Reward Forcing's EMA sink (RwF ``wan/modules/causal_model.py`` 88-108, 142-256).

    Keys before RoPE, roped at their cache slot at every call (as ``relative_rope``,
    without a flush), queries at the block's slots (their ``query_start_frame``). On the
    first call of a block that overflows W frames, the oldest frames after the S sink
    frames are evicted (FIFO) and,
    when they are exactly S frames, blended token by token into the sink, keys and values
    before RoPE: sink <- a sink + (1 - a) evicted (a = ``ema_decay``, 0.999), in the cache
    dtype as their code computes it. When the evicted frames are not S frames (blocks
    other than S frames, e.g. an independent first frame), their code replaces the first
    of the sink's frames by the evicted ones instead; so does this.

    ``key_frame`` of a sink slot names the frame that last wrote it whole (frame i of the
    first S frames, or an evicted frame that replaced it): after n blends it holds a^n of
    that frame and (1 - a) a^(n - j) of the frame evicted at the j-th blend.
    """

    name = EMA_SINK

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

    @property
    def query_position_shift(self) -> int:
        if self.block_start is None:
            return 0
        return self._held() - self.block_frames - self.block_start

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

    def __init__(self, cache: KVCache, *, window_frames: int, sink_frames: int, rope: RotaryTables | None = None) -> None:
        if rope is None:
            raise ValueError(f"cache_policy {self.name!r} needs the model's RoPE tables")
        if sink_frames < 1 or window_frames < 2 * sink_frames or window_frames % sink_frames:
            raise ValueError(f"cache_policy {self.name!r} needs an attention span that is a multiple of the anchor's "
                             f"{sink_frames} frames and holds two of them, got {window_frames}")  # fmt: skip
        if cache.capacity_frames < window_frames + sink_frames:
            raise ValueError(f"a cache of {cache.capacity_frames} frames cannot hold the span of {window_frames} "
                             f"frames plus the anchor of {sink_frames}")  # fmt: skip
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
            raise ValueError(f"cache_policy {self.name!r}: a call of frames [{start_frame}, {start_frame + num_frames}) "
                             f"that Rolling Forcing's procedure did not announce ({self._announced})")  # fmt: skip
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
            raise ValueError(f"cache_policy {self.name!r}: a call's first block starts at frame {start}, but the cache "
                             f"ends with frames {frames[-size:]}")  # fmt: skip
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


class ParticipativeCompressionPolicy(CachePolicy):
    """Deep Forcing, Deep Sink + Participative Compression (DF ``causal_model.py``), per layer.

    - every call appends its roped queries to the layer's window of the last R frames'
      queries (kept here as per-frame sums, which is all the score needs);
    - only on the first call of a block whose keys overflow the W-frame buffer (no host
      sync: the top-k runs on the device, its choice is read back when first needed):
      K_aug = cache + the block's keys (T tokens); recent = the last R_eff = min(R fsl, T)
      tokens; candidates [S fsl, T - R_eff); score phi_j = (sum of the recent queries) .
      k_j / (sqrt(d) H), one score per token shared by the heads; keep the sink, the top
      C = total_cap - sink - R_eff eligible candidates (selected fewer than ``max_reuse``
      times so far) and the recent tokens, in their order; then rotate the sink so it
      starts at cs - tail - S (first time by W - N, Deep Forcing's hard-coded 21 - N);
    - other calls append (first call of a non-overflowing block) or overwrite the block.

    Needs batch size 1 (the kept tokens are per batch element in Deep Forcing).
    """

    name = PARTICIPATIVE

    def __init__(
        self,
        cache: KVCache,
        *,
        window_frames: int,
        sink_frames: int,
        budget_frames: int,
        recent_frames: int,
        rope: RotaryTables | None = None,
        max_reuse: int = MAX_REUSE,
    ) -> None:
        if cache.batch_size != 1:
            raise ValueError(f"cache_policy {self.name!r} keeps tokens per video: batch size 1, got {cache.batch_size}")
        if recent_frames < 1 or not 0 <= sink_frames or sink_frames + recent_frames > budget_frames:
            raise ValueError(
                f"participative compression needs recent_frames >= 1 and sink_frames + recent_frames <= budget_frames, "
                f"got {sink_frames}, {recent_frames}, {budget_frames}"
            )
        if budget_frames > window_frames:
            raise ValueError(f"budget_frames {budget_frames} exceeds the window of {window_frames} frames")
        if cache.capacity_frames <= window_frames:
            raise ValueError(
                f"a cache of {cache.capacity_frames} frames leaves no room for the new block next to "
                f"the window of {window_frames} (K_aug)"
            )
        self.window_frames = window_frames
        self.sink_frames = sink_frames
        self.budget_frames = budget_frames
        self.recent_frames = recent_frames
        self.max_reuse = max_reuse
        b, _, h, d = cache.k.shape[1:]
        acc = torch.float64 if cache.dtype == torch.float64 else torch.float32
        # Sum over tokens of each of the last R query frames, per layer (oldest first).
        self.query_sums = torch.zeros((cache.num_layers, b, recent_frames, h, d), dtype=acc, device=cache.device)
        super().__init__(cache, rope=rope)

    def reset(self) -> None:
        super().reset()
        self.query_sums.zero_()
        self.query_frames_seen = 0
        # Times each stored token was selected, per layer, in buffer order; a layer's
        # last selection is folded in when first needed (it is read back lazily).
        self._counts = [np.zeros(0, dtype=np.int32) for _ in range(self.cache.num_layers)]
        self._pending: list[_Selection | None] = [None] * self.cache.num_layers
        self.sink_base: list[int | None] = [None] * self.cache.num_layers
        self.compress = [False] * self.cache.num_layers

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.query_sums.numel() * self.query_sums.element_size()

    def begin_call(self, start_frame, num_frames, grid=None):
        super().begin_call(start_frame, num_frames, grid)
        self.query_frames_seen = min(self.recent_frames, self.query_frames_seen + num_frames)

    def start_block(self, start: int, frames: int) -> None:
        limit = self.window_frames * self.frame_seq_length
        new = frames * self.frame_seq_length
        self.compress = [self.cache.length(layer) + new > limit for layer in range(self.cache.num_layers)]
        self._append_block(start, frames)
        for layer, pending in enumerate(self._pending):
            if pending is None:
                self._counts[layer] = np.concatenate([self._counts[layer], np.zeros(new, dtype=np.int32)])
            else:
                pending.appended += new

    def counts(self, layer: int) -> np.ndarray:
        """How often each stored token of ``layer`` was selected as top-C (buffer order)."""
        pending = self._pending[layer]
        if pending is not None:
            keep, selected = pending.keep(), pending.selected()
            counts = self._counts[layer][keep]
            counts[np.searchsorted(keep, selected)] += 1
            self._counts[layer] = np.concatenate([counts, np.zeros(pending.appended, dtype=np.int32)])
            self._pending[layer] = None
        return self._counts[layer]

    def repeat_call(self) -> None:
        self.compress = [False] * self.cache.num_layers

    def attend(self, layer, q, k, v, raw_k=None):
        self._remember_queries(layer, q)
        self.cache.write_tail(layer, k, v)
        if self.new_block and self.compress[layer]:
            self._compress(layer)
        return self.cache.keys(layer)

    def _remember_queries(self, layer: int, q: torch.Tensor) -> None:
        sums = self.query_sums[layer]
        frames = q.shape[1] // self.frame_seq_length
        new = q.unflatten(1, (frames, self.frame_seq_length)).sum(2, dtype=sums.dtype)
        r = self.recent_frames
        if frames >= r:
            sums.copy_(new[:, frames - r :])
        else:
            sums[:, : r - frames] = sums[:, frames:].clone()
            sums[:, r - frames :] = new

    def _scores(self, layer: int, lo: int, hi: int, recent_frames: int) -> torch.Tensor:
        """phi_j for stored tokens [lo, hi) of ``layer``, as Deep Forcing computes it (on the device).

        Their code sums the recent queries and takes the dot product in the cache dtype
        (bf16 in their runs) and casts to float32 after; so does this (the per-frame sums
        are accumulated in float32 first). bf16 scores tie often: which of equal scores
        top-k keeps is up to ``torch.topk``, as in their code.
        """
        _, h, d = self.query_sums.shape[2:]
        query = self.query_sums[layer, :, self.recent_frames - recent_frames :].sum(1)  # [B, H, D]
        keys = self.cache.k[layer, :, lo:hi].flatten(2)  # [B, n, H*D]
        fused = torch.matmul(keys, query.flatten(1).to(keys.dtype).unsqueeze(-1)).squeeze(-1)
        score_dtype = torch.float64 if keys.dtype == torch.float64 else torch.float32
        return fused[0].to(score_dtype) * (1.0 / (math.sqrt(d) * h))

    def _compress(self, layer: int) -> None:
        """Participative compression of ``layer``, then the sink's re-alignment; no host sync.

        Which tokens are eligible (selected fewer than ``max_reuse`` times) is known on the
        host, hence how many stay; the top-k runs on the device and the choice comes back
        to the host asynchronously, read when the layer's metadata is next needed.
        """
        fsl = self.frame_seq_length
        total = self.cache.length(layer)
        sink = min(self.sink_frames * fsl, total)
        recent = min(self.query_frames_seen * fsl, total)
        cap = min(self.budget_frames * fsl, self.window_frames * fsl)
        cap = min(max(cap, sink + recent), total)
        top_c = max(0, cap - sink - recent)
        old_end = max(0, total - recent)
        if old_end < sink:
            raise ValueError(f"participative compression: the recent tokens ({recent}) overlap the sink ({sink})")
        counts = self.counts(layer)
        eligible = np.ones(old_end - sink, dtype=bool)
        if self.max_reuse > 0:
            eligible = counts[sink:old_end] < self.max_reuse
        take = min(top_c, int(eligible.sum()))
        end = sink + take + (total - old_end)
        # Deep Sink re-alignment (DF causal_model.py, on rolled calls, after the prune; the
        # sink is a kept prefix, so it is rotated first here, from the known kept count).
        sink_tokens = self.sink_frames * fsl
        sink_len = min(end, sink_tokens)
        tail_start = max(sink_tokens, end - self.window_frames * fsl + sink_tokens)
        desired = self.block_start - (end - tail_start) // fsl - sink_len // fsl
        if self.sink_frames > 0 and sink_len > 0:
            if self.sink_base[layer] is None:
                delta = self.window_frames - self.budget_frames  # DF: 21 - PC_capacity // 1560
            else:
                delta = desired - self.sink_base[layer]
            self.sink_base[layer] = desired
            self._rotate_sink(sink_len // fsl, delta, [layer])
        device = self.cache.device
        if take == 0:
            selection = _Selection(torch.zeros(0, dtype=torch.long, device=device), sink, old_end, total)
        else:
            scores = self._scores(layer, sink, old_end, recent // fsl)
            if not eligible.all():
                scores = scores.masked_fill(~host_to_device(eligible, device), -math.inf)
            chosen = torch.topk(scores, take, sorted=False).indices.sort().values + sink
            selection = _Selection(chosen, sink, old_end, total)
        index = torch.cat(
            [
                torch.arange(sink, device=device),
                selection.device_selected,
                torch.arange(old_end, total, device=device),
            ]
        )
        self.cache.keep_later(layer, index, end, sink, selection.keep)
        self._pending[layer] = selection


class _Selection:
    """Top-C tokens chosen on the device, copied to the host without waiting; read when needed."""

    def __init__(self, selected: torch.Tensor, sink: int, old_end: int, total: int) -> None:
        self.device_selected = selected
        self.sink, self.old_end, self.total = sink, old_end, total
        self.appended = 0  # tokens appended to the layer since (their counts start at 0)
        self._event = None
        if selected.device.type == "cuda":
            self._host = torch.empty(selected.shape, dtype=selected.dtype, pin_memory=True)
            self._host.copy_(selected, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = selected
        self._selected: np.ndarray | None = None
        self._keep: np.ndarray | None = None

    def selected(self) -> np.ndarray:
        if self._selected is None:
            if self._event is not None:
                self._event.synchronize()  # long done, unless the layer is read right away
            self._selected = self._host.numpy().astype(np.int64, copy=True)
        return self._selected

    def keep(self) -> np.ndarray:
        """Kept token indices into K_aug: the sink, the top-C, the recent tokens, ascending."""
        if self._keep is None:
            self._keep = np.concatenate([np.arange(self.sink), self.selected(), np.arange(self.old_end, self.total)])
        return self._keep


POLICY_CLASSES: dict[str, type[CachePolicy]] = {
    GLOBAL: GlobalPolicy,
    WINDOW: WindowPolicy,
    SINK: SinkPolicy,
    DEEP_SINK: DeepSinkPolicy,
    PARTICIPATIVE: ParticipativeCompressionPolicy,
    REROPE_SINK: ReropeSinkPolicy,
    ROLLING_SINK: RollingSinkPolicy,
    RELATIVE_ROPE: RelativeRopePolicy,
    EMA_SINK: EmaSinkPolicy,
    ROLLING_FORCING: RollingForcingPolicy,
}


def new_policy(
    model: WanModel,
    cache_policy: str,
    *,
    frame_seq_length: int,
    num_frames: int | None = None,
    local_attn_frames: int = -1,
    sink_frames: int = 0,
    budget_frames: int = 0,
    recent_frames: int = 0,
    largest_block: int | None = None,
    batch_size: int = 1,
    max_reuse: int = MAX_REUSE,
    ema_decay: float = EMA_DECAY,
    flush_every_blocks: int = 0,
) -> CachePolicy:
    """A policy for ``model`` with a cache sized by the policy (not by the video, when bounded).

    ``global`` holds ``num_frames``; participative compression holds W frames plus room
    for the new block (``largest_block``, default the recent window) while it compresses;
    ``rolling_forcing`` holds W frames plus its anchor (RF: 21 + 3); every other policy
    holds W frames. ``max_reuse``, ``ema_decay`` and
    ``flush_every_blocks`` are the policies' constants (not config keys), for tests.
    """
    config = model.config
    if cache_policy not in POLICY_CLASSES:
        raise ValueError(f"unknown cache_policy {cache_policy!r} (known: {', '.join(POLICY_CLASSES)})")
    if cache_policy == GLOBAL and num_frames is None:
        raise ValueError("cache_policy 'global' needs num_frames (its cache grows with the video)")
    capacity = CACHE_POLICY_TABLE[cache_policy].capacity_frames(
        num_frames=num_frames or 0, local_attn_frames=local_attn_frames, largest_block=largest_block or recent_frames,
        sink_frames=sink_frames,
    )  # fmt: skip
    cache = KVCache(
        num_layers=config.num_layers,
        batch_size=batch_size,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        frame_seq_length=frame_seq_length,
        capacity_frames=capacity,
        dtype=model.dtype,
        device=model.device,
    )
    rope = model.rope
    if cache_policy == GLOBAL:
        return GlobalPolicy(cache, rope=rope)
    if cache_policy == WINDOW:
        return WindowPolicy(cache, window_frames=local_attn_frames, rope=rope)
    if cache_policy == PARTICIPATIVE:
        return ParticipativeCompressionPolicy(
            cache,
            window_frames=local_attn_frames,
            sink_frames=sink_frames,
            budget_frames=budget_frames,
            recent_frames=recent_frames,
            rope=rope,
            max_reuse=max_reuse,
        )
    if cache_policy == RELATIVE_ROPE:
        return RelativeRopePolicy(
            cache, window_frames=local_attn_frames, sink_frames=sink_frames, rope=rope, flush_every_blocks=flush_every_blocks
        )
    if cache_policy == EMA_SINK:
        return EmaSinkPolicy(cache, window_frames=local_attn_frames, sink_frames=sink_frames, rope=rope, ema_decay=ema_decay)
    return POLICY_CLASSES[cache_policy](cache, window_frames=local_attn_frames, sink_frames=sink_frames, rope=rope)


def policy_from_options(model: WanModel, options: GenerationOptions, *, frame_seq_length: int) -> CachePolicy:
    """The policy ``generate()`` uses: ``options.cache_policy`` with its resolved frame counts."""
    return new_policy(
        model,
        options.cache_policy,
        frame_seq_length=frame_seq_length,
        num_frames=options.num_frames,
        local_attn_frames=options.local_attn_frames,
        sink_frames=options.sink_frames,
        budget_frames=options.budget_frames,
        recent_frames=options.recent_frames,
        largest_block=max(options.block_sizes()),
    )

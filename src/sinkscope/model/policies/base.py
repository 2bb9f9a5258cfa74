"""The policy interface (``CachePolicy``), the registry of policy classes
(``register_policy``), and the plain FIFO policies: global, window, sink."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

from sinkscope.model.cache import KVCache, whole_frames
from sinkscope.model.layout import AttentionLayout
from sinkscope.model.rope import RotaryTables
from sinkscope.options import (
    CACHE_POLICY_TABLE,
    GLOBAL,
    SINK,
    WINDOW,
    PolicySpec,
)

if TYPE_CHECKING:
    from sinkscope.model.generation_edits import GenerationEdits

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


@dataclass(frozen=True)
class PolicySettings:
    """What a policy class is built from (``CachePolicy.build``): the resolved frame
    counts, the model's RoPE tables, and the policies' constants (not config keys; tests
    change them)."""

    window_frames: int = -1
    sink_frames: int = 0
    budget_frames: int = 0
    recent_frames: int = 0
    rope: RotaryTables | None = None
    max_reuse: int = MAX_REUSE
    ema_decay: float = EMA_DECAY
    flush_every_blocks: int = 0


# Policy name -> its class; filled by ``register_policy`` as the policy modules are imported
# (``sinkscope.model.policies`` imports them all).
POLICY_CLASSES: dict[str, type[CachePolicy]] = {}
_Policy = TypeVar("_Policy", bound="type[CachePolicy]")


def register_policy(cls: _Policy) -> _Policy:
    """Class decorator: ``cls`` is the code of the cache policy ``cls.name``, whose spec is
    that name's row of ``sinkscope.options.CACHE_POLICY_TABLE``."""
    if cls.name not in CACHE_POLICY_TABLE:
        raise ValueError(
            f"{cls.__name__}: cache policy {cls.name!r} has no row in sinkscope.options.CACHE_POLICY_TABLE"
        )
    if POLICY_CLASSES.get(cls.name, cls) is not cls:
        raise ValueError(
            f"{cls.__name__}: cache policy {cls.name!r} is registered already ({POLICY_CLASSES[cls.name].__name__})"
        )
    POLICY_CLASSES[cls.name] = cls
    return cls


class CachePolicy:
    """Self-Forcing's block bookkeeping; subclasses decide how a new block gets room."""

    name: ClassVar[str] = ""
    # Whether the cache size is independent of the video length.
    bounded: ClassVar[bool] = True
    # Whether every call wants the block's keys before RoPE (``wants_raw_keys``).
    raw_keys_every_call: ClassVar[bool] = False
    # The ``PolicySettings`` fields its constructor takes as keywords, beside ``rope``.
    settings_keys: ClassVar[tuple[str, ...]] = ()
    # The generation's edits (``sinkscope.model.generation_edits``, set by ``policy_from_options``);
    # None, and nothing is done for them, when there is none.
    edits: GenerationEdits | None = None

    @classmethod
    def build(cls, cache: KVCache, settings: PolicySettings, options: Mapping[str, Any]) -> CachePolicy:
        """The policy around ``cache`` (sized by ``new_policy``), given the settings its
        constructor takes (``settings_keys``) and its own keys (``options``: the spec's
        ``OptionSpec`` keys, as the generation options hold them)."""
        return cls(cache, rope=settings.rope, **{key: getattr(settings, key) for key in cls.settings_keys}, **options)

    @property
    def spec(self) -> PolicySpec:
        """The policy's row of ``sinkscope.options.CACHE_POLICY_TABLE``."""
        return CACHE_POLICY_TABLE[self.name]

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
        if self.edits is not None:
            self.edits.reset()

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
        if not self.spec.recaches:
            raise ValueError(f"cache_policy {self.name!r} cannot re-cache (its cache holds keys that moved)")
        if self.block_start is None:
            raise ValueError("nothing to re-cache before the first block")
        end = self.block_start + self.block_frames
        if num_frames < 1 or start_frame < 0 or start_frame + num_frames != end:
            raise ValueError(
                f"a re-cache recomputes frames ending at the last generated frame {end - 1}, "
                f"not [{start_frame}, {start_frame + num_frames})"
            )
        self._pending_recache = (int(start_frame), int(num_frames))

    def begin_call(self, start_frame: int, num_frames: int, grid: tuple[int, int] | None = None) -> None:
        """A model call for frames [start_frame, start_frame + num_frames) begins."""
        if grid is not None:
            self.grid = (int(grid[0]), int(grid[1]))
        self.recaching = None
        if self._pending_recache is not None:
            if self._pending_recache != (start_frame, num_frames):
                raise ValueError(
                    f"re-cache of frames {self._pending_recache} announced, the call is {(start_frame, num_frames)}"
                )
            self.recaching, self._pending_recache = self._pending_recache, None
            self.new_block = False
            if self.edits is not None:
                self.edits.frames_rewritten(self._rewritten_frames())
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
        if self.block_start is not None:
            self.finish_block()
        self.block_start, self.block_frames, self.new_block = start_frame, num_frames, True
        self.start_block(start_frame, num_frames)

    def finish_block(self) -> None:
        """The current block is done, a new one begins: the frames that just became earlier
        frames (the finished block's) get the generation's cache edits, once."""
        if self.edits is not None:
            self.edits.edit_cache(self.cache, range(self.block_start, self.block_start + self.block_frames))

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

    def frame_bias(self, layer: int) -> torch.Tensor | None:
        """What this call of ``layer`` adds to its scores, [heads, key segments] float32 on the
        cache's device (``GenerationEdits.frame_bias``); None when nothing."""
        if self.edits is None:
            return None
        return self.edits.frame_bias(layer, self.layout(layer), self.cache.device)

    def _rewritten_frames(self) -> list[int]:
        """The frames the re-cache call about to run rewrites (``_rewrite``'s rule)."""
        start, count = self.recaching
        protected = getattr(self, "sink_frames", 0) if start > 0 else 0
        return [frame for frame in range(start, start + count) if frame >= protected]

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
                    raise ValueError(
                        f"cache_policy {self.name!r}: frame {segment.frame} is not held whole at its own position"
                    )
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

    def chosen_frames(self, layer: int) -> frozenset[int]:
        """Frames whose kept tokens the video's scores choose (any number of them, or none):
        the part of the layout a policy does not fix (``sinkscope.pipeline.cachecheck``).
        Empty unless the policy selects tokens."""
        return frozenset()

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


@register_policy
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


@register_policy
class WindowPolicy(CachePolicy):
    """Self-Forcing ``local_attn_size`` (W frames held, the current block included).

    On the first call of a block that would overflow W frames, the oldest frames after
    the first ``sink_frames`` are evicted (FIFO) and the rest moves left; keys keep the
    RoPE phase of the position they were generated at.
    """

    name = WINDOW
    settings_keys = ("window_frames",)

    def __init__(
        self, cache: KVCache, *, window_frames: int, sink_frames: int = 0, rope: RotaryTables | None = None
    ) -> None:
        if not 0 <= sink_frames < window_frames:
            raise ValueError(f"sink_frames must be in [0, {window_frames}), got {sink_frames}")
        if cache.capacity_frames < window_frames:
            raise ValueError(f"a cache of {cache.capacity_frames} frames cannot hold a window of {window_frames}")
        self.window_frames = window_frames
        self.sink_frames = sink_frames
        super().__init__(cache, rope=rope)

    @property
    def protected_frames(self) -> int:
        """Frames at the front of the cache that eviction keeps: the sink."""
        return self.sink_frames

    def start_block(self, start: int, frames: int) -> None:
        held, kept, window = self._held(), self.protected_frames, self.window_frames
        overflow = held + frames - window
        if overflow > 0:
            if overflow > held - kept:
                raise ValueError(
                    f"window of {window} frames keeping {kept} frames at its front cannot hold a block of {frames} "
                    "frames"
                )
            self.cache.evict(overflow, after=kept)
        self._append_block(start, frames)
        if overflow > 0:
            self.rolled(start, overflow)

    def rolled(self, start: int, evicted: int) -> None:
        """Hook: ``evicted`` frames were evicted for the block starting at ``start`` (already appended)."""


@register_policy
class SinkPolicy(WindowPolicy):
    """Self-Forcing ``sink_size`` / LongLive's frame sink: the first S frames are never evicted.

    Attention: the S sink frames at their own positions + the last W - S frames.
    """

    name = SINK
    settings_keys = ("window_frames", "sink_frames")

    def __init__(
        self, cache: KVCache, *, window_frames: int, sink_frames: int, rope: RotaryTables | None = None
    ) -> None:
        if sink_frames < 1:
            raise ValueError(f"cache_policy {self.name!r} needs sink_frames >= 1, got {sink_frames}")
        super().__init__(cache, window_frames=window_frames, sink_frames=sink_frames, rope=rope)

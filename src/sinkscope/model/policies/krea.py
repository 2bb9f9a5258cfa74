"""Krea Realtime 14B's cache: cleared before every block and rebuilt from the context frames."""

from __future__ import annotations

from collections.abc import Sequence

from sinkscope.model.cache import KVCache, whole_frames
from sinkscope.model.policies.base import CachePolicy, register_policy
from sinkscope.model.rope import RotaryTables
from sinkscope.options import KREA_RECOMPUTE


@register_policy
class KreaRecomputePolicy(CachePolicy):
    """Krea Realtime 14B's KV recomputation (krea-ai/realtime-video ``release_server.py``
    ``recompute_kv_cache``, ``wan/modules/causal_model.py``; fact sheet section 2.4).

    Calls come from ``sinkscope.generation.krea``: per block b >= 1 first a **recompute
    call** (announced by ``begin_recompute``) over the context frames, then the block's
    denoising calls. With W = ``window_frames`` (6: a context of one block plus the block):

    - recompute call: the cache is cleared (the cross-attention K/V stay) and holds the
      context's keys roped at positions 0 .. C - 1 (queries and keys alike: the call
      attends only itself, bidirectionally);
    - denoising calls: the block is appended after what the cache holds, at positions
      C .. C + F - 1 (block 0: 0 .. F - 1, nothing before it), and attends every key held;
      later steps overwrite its keys in place.

    No position grows past W - 1. Segments carry the absolute frame each key came from (for
    the re-encoded oldest context frame: the frame whose decoded pixels it re-encodes) and
    the position it is attended at, so ``key_position_shift`` relative to the queries is 0
    in every call: the context sits just before the block, as its frames do in the video.
    """

    name = KREA_RECOMPUTE
    settings_keys = ("window_frames",)

    def __init__(self, cache: KVCache, *, window_frames: int, rope: RotaryTables | None = None) -> None:
        if window_frames < 2 or cache.capacity_frames < window_frames:
            raise ValueError(
                f"cache_policy {self.name!r} needs a cache of at least 2 frames holding the window, got "
                f"{window_frames} in {cache.capacity_frames}"
            )
        self.window_frames = window_frames
        super().__init__(cache, rope=rope)

    def reset(self) -> None:
        super().reset()
        self._announced: tuple[int, ...] | None = None
        # The context frames of the recompute call running, or None for a denoising call.
        self.recomputing: tuple[int, ...] | None = None
        self._query_shift = 0

    def begin_recompute(self, frames: Sequence[int]) -> None:
        """The next model call rebuilds the cache from the context ``frames`` (consecutive
        absolute frames ending at the last generated one)."""
        frames = tuple(int(f) for f in frames)
        end = 0 if self.block_start is None else self.block_start + self.block_frames
        if not frames or frames != tuple(range(frames[0], frames[0] + len(frames))) or frames[-1] != end - 1:
            raise ValueError(
                f"a recompute call takes consecutive frames ending at the last generated frame {end - 1}, not {frames}"
            )
        if len(frames) >= self.window_frames:
            raise ValueError(
                f"a context of {len(frames)} frames leaves no room for a block in a window of {self.window_frames}"
            )
        self._announced = frames

    def begin_call(self, start_frame: int, num_frames: int, grid: tuple[int, int] | None = None) -> None:
        """A recompute call if one was announced; else a denoising call, as every policy's."""
        self.recomputing = None
        if self._announced is None:
            super().begin_call(start_frame, num_frames, grid)
            return
        if grid is not None:
            self.grid = (int(grid[0]), int(grid[1]))
        frames, self._announced = self._announced, None
        if (start_frame, num_frames) != (frames[0], len(frames)):
            raise ValueError(f"recompute of frames {frames} announced, the call is {(start_frame, num_frames)}")
        cross = self.cache.cross
        self.cache.reset()  # the cleared cache (Krea zeroes it); the text K/V stay
        self.cache.cross = cross
        self.cache.append(whole_frames(frames, self.frame_seq_length, range(len(frames))))
        self.recomputing, self.new_block = frames, False
        self._query_shift = -frames[0]

    def finish_block(self) -> None:
        # The earlier frames are the recomputed context the cache holds, not the finished block.
        if self.edits is not None and self._held():
            self.edits.edit_cache(self.cache, self.cache.frames(0))

    def start_block(self, start: int, frames: int) -> None:
        held = self._held()
        if start and not held:
            raise ValueError(f"the block at frame {start} needs the recompute call before it")
        if held + frames > self.window_frames:
            raise ValueError(
                f"a window of {self.window_frames} frames cannot hold {held} context frames and a block of {frames}"
            )
        self.cache.append(whole_frames(range(start, start + frames), self.frame_seq_length, range(held, held + frames)))
        self._query_shift = held - start

    @property
    def query_position_shift(self) -> int:
        return self._query_shift

    @property
    def query_frames(self) -> tuple[int, ...]:
        if self.recomputing is not None:
            return self.recomputing
        return super().query_frames

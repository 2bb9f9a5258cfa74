"""What one self-attention call in KV-cache mode sees, named by absolute frame.

A cache policy may evict frames, drop tokens or move keys to other RoPE positions; the
layout is how statistics stay labelled by the frame each key token was generated at.
It is handed to attention observers (``sinkscope.generation.capture``) with the q and k of the call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AttentionLayout:
    """The query block and the key segments of one call.

    ``k`` holds one contiguous segment per key frame, in ``key_frames`` order (not
    necessarily ascending), ``key_lengths[i]`` tokens long: the frame's full
    ``frame_seq_length`` unless a policy dropped tokens of it. A frame may hold more
    than one segment when a policy re-inserts copies of its keys at other RoPE positions
    (``rolling_sink``); the (frame, shift) pairs are unique.
    """

    query_frames: tuple[int, ...]
    key_frames: tuple[int, ...]
    key_lengths: tuple[int, ...]
    # RoPE temporal position at which each key frame is attended, minus the position it
    # was generated at (0 for keys that kept their phase).
    key_position_shift: tuple[int, ...]
    # Index within its frame of every key token, in k's order (a 1-D integer array on
    # the CPU), when some frame is partial; None when every frame is whole.
    key_token_index: Any = field(default=None, compare=False)
    # RoPE temporal position of the queries minus their frames (one number for the
    # call): 0 unless the policy ropes the queries at cache-relative positions
    # (``relative_rope``, ``ema_sink``).
    query_position_shift: int = 0

    def __post_init__(self) -> None:
        if not (len(self.key_frames) == len(self.key_lengths) == len(self.key_position_shift)):
            raise ValueError("key_frames, key_lengths and key_position_shift must have one entry per key frame")
        pairs = list(zip(self.key_frames, self.key_position_shift))
        if len(set(pairs)) != len(pairs):
            raise ValueError(f"key frames repeat at the same RoPE shift: {pairs}")

    @property
    def num_keys(self) -> int:
        return sum(self.key_lengths)

    @property
    def relative_position_shift(self) -> tuple[int, ...]:
        """Per key segment: its RoPE distance to the queries minus its frame distance.

        ``key_position_shift - query_position_shift``: what RoPE lets attention see (it
        only sees position differences). Equal to ``key_position_shift`` when the queries
        sit at their own frames; the capture writes this into ``key_position_shift``.
        """
        return tuple(s - self.query_position_shift for s in self.key_position_shift)

    @classmethod
    def whole_frames(
        cls, query_frames, key_frames, frame_seq_length: int, shifts=None, query_shift: int = 0
    ) -> AttentionLayout:
        """A layout of whole frames (no dropped tokens)."""
        key_frames = tuple(int(f) for f in key_frames)
        return cls(
            query_frames=tuple(int(f) for f in query_frames),
            key_frames=key_frames,
            key_lengths=(int(frame_seq_length),) * len(key_frames),
            key_position_shift=tuple(int(s) for s in shifts) if shifts is not None else (0,) * len(key_frames),
            query_position_shift=int(query_shift),
        )

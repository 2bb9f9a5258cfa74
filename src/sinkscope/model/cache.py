"""Storage of the block-causal KV cache: per-layer key/value buffers and what each token is.

Policy-free. A cache policy (``sinkscope.model.policies``) decides, call by call, what to
append, evict, compact or move to another RoPE position; this module only does it:

- ``k``/``v``: one buffer per layer, stacked as [layers, B, capacity_tokens, H, D] in
  the model dtype; layer ``l`` holds ``length(l)`` tokens at the front. Keys are stored
  as the policy hands them over (after q/k RMSNorm and RoPE, as Self-Forcing stores them).
- metadata, per layer and on the CPU (never read back from the device): the stored tokens
  form contiguous runs, one ``Segment`` per (frame, run), in buffer order. A segment names
  the absolute frame, the index within the frame of each token (all of them unless a
  policy dropped some), and the temporal RoPE position its stored keys carry.
- primitives: ``append`` (room for a new block in every layer), ``write_tail`` (the
  current block's keys, first call or overwrite), ``write`` (at a token offset),
  ``evict`` (FIFO: drop whole frames behind the first ones, every layer in one pass),
  ``keep`` (compaction to a token subset, order preserved; ``keep_later`` does it with
  an index still on the device and updates the metadata when it is first read, so a
  compaction costs no host sync), ``rotate`` (move keys to another temporal RoPE
  position in place), ``set_positions`` and ``relabel`` (metadata only).

A policy may also store keys before RoPE (``relative_rope``, ``ema_sink``: roped at
attention time); a segment's ``position`` is then the position they are attended at.

Layers share one metadata tuple while every operation applied to all of them, so an
attention layout built from it serves every layer of a call (``layout``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from sinkscope.model.layout import AttentionLayout
from sinkscope.model.quantize import cache_format


@dataclass(frozen=True, eq=False)
class Segment:
    """Stored tokens of one frame, contiguous in the buffer.

    ``tokens``: index within the frame of each stored token (ascending, a read-only
    int64 array), or None when the frame is whole (0 .. length-1).
    ``position``: the temporal RoPE position the stored keys carry now.
    """

    frame: int
    length: int
    position: int
    tokens: np.ndarray | None = None

    @property
    def shift(self) -> int:
        return self.position - self.frame

    @property
    def whole(self) -> bool:
        return self.tokens is None

    def token_index(self) -> np.ndarray:
        return np.arange(self.length, dtype=np.int64) if self.tokens is None else self.tokens

    def moved(self, position: int) -> Segment:
        return Segment(self.frame, self.length, int(position), self.tokens)


@dataclass
class _Deferred:
    """A compaction whose host index is not read yet; appends made since, in order."""

    before: tuple[Segment, ...]
    index: Callable[[], np.ndarray]
    appended: list[Segment] = field(default_factory=list)


def whole_frames(
    frames: Iterable[int], frame_seq_length: int, positions: Iterable[int] | None = None
) -> tuple[Segment, ...]:
    frames = [int(f) for f in frames]
    positions = frames if positions is None else [int(p) for p in positions]
    return tuple(Segment(f, frame_seq_length, p) for f, p in zip(frames, positions, strict=True))


def host_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A CPU array on ``device``; on CUDA through pinned memory without a host sync."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def rotate_temporal(k: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Keys [..., D] moved in time: the first P channel pairs (2i, 2i+1) rotated by ``angles``
    [P] (float64), in float64, cast back to k's dtype, as Deep Forcing does; the other
    channels as they are."""
    pairs = angles.shape[0]
    rotation = torch.polar(torch.ones_like(angles), angles)
    head = k[..., : 2 * pairs].to(torch.float64).unflatten(-1, (pairs, 2)).contiguous()
    turned = torch.view_as_real(torch.view_as_complex(head) * rotation).flatten(-2).to(k.dtype)
    return turned if turned.shape[-1] == k.shape[-1] else torch.cat((turned, k[..., 2 * pairs :]), dim=-1)


class KVCache:
    """Self-attention keys/values of every layer, their metadata, plus the cross-attention K/V."""

    def __init__(
        self,
        *,
        num_layers: int,
        batch_size: int,
        num_heads: int,
        head_dim: int,
        frame_seq_length: int,
        capacity_frames: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if capacity_frames < 1:
            raise ValueError(f"capacity_frames must be positive, got {capacity_frames}")
        self.num_layers = num_layers
        self.batch_size = batch_size
        self.frame_seq_length = frame_seq_length
        self.capacity_frames = capacity_frames
        self.capacity_tokens = capacity_frames * frame_seq_length
        shape = (num_layers, batch_size, self.capacity_tokens, num_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.reset()

    def reset(self) -> None:
        """Forget every token (buffers are overwritten later, not zeroed, as in Self-Forcing)."""
        empty: tuple[Segment, ...] = ()
        self._segments: list[tuple[Segment, ...]] = [empty] * self.num_layers
        self._deferred: dict[int, _Deferred] = {}
        self.lengths: list[int] = [0] * self.num_layers
        self.cross: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.num_layers
        self._layouts: dict[tuple[int, tuple[int, ...]], tuple[tuple[Segment, ...], AttentionLayout]] = {}

    def forget_context(self) -> None:
        """Drop the cross-attention K/V: the next call computes them from its (new) context."""
        self.cross = [None] * self.num_layers

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    # -- reading ---------------------------------------------------------------------

    def length(self, layer: int) -> int:
        return self.lengths[layer]

    def segments_of(self, layer: int) -> tuple[Segment, ...]:
        """The stored segments of ``layer`` in buffer order (reads a deferred compaction's index)."""
        if layer in self._deferred:
            self._resolve(layer)
        return self._segments[layer]

    @property
    def segments(self) -> list[tuple[Segment, ...]]:
        """Every layer's segments (see ``segments_of``)."""
        for layer in list(self._deferred):
            self._resolve(layer)
        return list(self._segments)

    def frames(self, layer: int = 0) -> list[int]:
        """Absolute frames stored in ``layer``, in buffer order."""
        return [s.frame for s in self.segments_of(layer)]

    def keys(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every stored k and v of ``layer``, [B, length, H, D] views."""
        end = self.lengths[layer]
        return self.k[layer, :, :end], self.v[layer, :, :end]

    def token_metadata(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per stored token of ``layer``: (absolute frame, index within the frame, RoPE position)."""
        return _token_metadata(self.segments_of(layer))

    def layout(self, layer: int, query_frames: Sequence[int], query_shift: int = 0) -> AttentionLayout:
        """What a call of ``layer`` with these query frames sees; built once per metadata tuple.

        ``query_shift``: the queries' RoPE position minus their frames (cache-relative
        policies rope the queries at their slot, not at their frame).
        """
        segs = self.segments_of(layer)
        key = (id(segs), tuple(query_frames), int(query_shift))
        hit = self._layouts.get(key)
        if hit is not None and hit[0] is segs:
            return hit[1]
        token_index = None
        if any(not s.whole for s in segs):
            token_index = np.concatenate([s.token_index() for s in segs])
            token_index.flags.writeable = False
        layout = AttentionLayout(
            query_frames=tuple(int(f) for f in query_frames),
            key_frames=tuple(s.frame for s in segs),
            key_lengths=tuple(s.length for s in segs),
            key_position_shift=tuple(s.shift for s in segs),
            key_token_index=token_index,
            query_position_shift=int(query_shift),
        )
        if len(self._layouts) >= 4 * self.num_layers:
            self._layouts.clear()
        self._layouts[key] = (segs, layout)  # keeps segs alive, so its id stays unique
        return layout

    # -- primitives ------------------------------------------------------------------

    def _layers(self, layers: Iterable[int] | None) -> list[int]:
        return list(range(self.num_layers)) if layers is None else [int(layer) for layer in layers]

    def _assign(self, layers: list[int], build) -> None:
        """New metadata for ``layers``: layers that shared a tuple share the new one."""
        done: dict[int, tuple[Segment, ...]] = {}
        for layer in layers:
            old = self.segments_of(layer)
            new = done.get(id(old))
            if new is None:
                new = done[id(old)] = build(old)
            self._segments[layer] = new
            self.lengths[layer] = sum(s.length for s in new)

    def _resolve(self, layer: int) -> None:
        deferred = self._deferred.pop(layer)
        self._segments[layer] = _compact(deferred.before, deferred.index(), self.frame_seq_length) + tuple(
            deferred.appended
        )

    def append(self, segments: Sequence[Segment], layers: Iterable[int] | None = None) -> None:
        """Room for new tokens after each layer's last one (their k/v come with write_tail)."""
        layers = self._layers(layers)
        extra = sum(s.length for s in segments)
        for layer in layers:
            if self.lengths[layer] + extra > self.capacity_tokens:
                raise ValueError(
                    f"KV cache of {self.capacity_frames} frames ({self.capacity_tokens} tokens) cannot take "
                    f"{extra} more tokens in layer {layer} (it holds {self.lengths[layer]})"
                )
        added = tuple(segments)
        for layer in [layer for layer in layers if layer in self._deferred]:
            self._deferred[layer].appended.extend(added)
            self.lengths[layer] += extra
        self._assign([layer for layer in layers if layer not in self._deferred], lambda old: old + added)

    def write_tail(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v [B, L, H, D] as the last L tokens of ``layer`` (the current block)."""
        end = self.lengths[layer]
        self.k[layer, :, end - k.shape[1] : end] = k
        self.v[layer, :, end - v.shape[1] : end] = v

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
        """Overwrite stored tokens [start, start + L) of ``layer`` (v kept when None)."""
        self.k[layer, :, start : start + k.shape[1]] = k
        if v is not None:
            self.v[layer, :, start : start + v.shape[1]] = v

    def quantize_frames(self, frames: Sequence[int], format: str, tensors: str = "both") -> None:
        """Store the tokens of ``frames``, in every layer, as a cache of ``format`` reads them back
        (``sinkscope.model.quantize``; ``tensors``: k, v or both), in place. The tokens of one
        layer's frames form one tensor of the format (nvfp4's per-tensor scale: that layer's
        ``frames``, all heads): pass one block's frames, as LongLive 2.0 quantizes a chunk."""
        entry = cache_format(format)
        buffers = {"k": (self.k,), "v": (self.v,), "both": (self.k, self.v)}[tensors]
        for layer in range(self.num_layers):
            runs = _token_runs(self.segments_of(layer), frames)
            for buffer in buffers:
                if len(runs) == 1:  # a block's frames lie together: quantize the view in place
                    view = buffer[layer, :, runs[0][0] : runs[0][1]]
                    view.copy_(entry.roundtrip(view))
                elif runs:
                    back = entry.roundtrip(torch.cat([buffer[layer, :, a:b] for a, b in runs], dim=1))
                    at = 0
                    for a, b in runs:
                        buffer[layer, :, a:b] = back[:, at : at + b - a]
                        at += b - a

    def evict(self, count: int, after: int) -> None:
        """FIFO: drop the ``count`` segments that follow the first ``after`` in every layer.

        Every layer must hold the same whole frames (frame-granular policies). The rest
        moves left in one pass for all layers, in chunks no longer than the gap, so no
        temporary copy of the cache is needed.
        """
        everything = self.segments
        segs = everything[0]
        shape = [(s.frame, s.length) for s in segs]
        if any(other is not segs and [(s.frame, s.length) for s in other] != shape for other in everything):
            raise ValueError("evict needs every layer to hold the same frames")
        if count < 0 or after < 0 or after + count > len(segs):
            raise ValueError(f"cannot evict {count} frames after the first {after} of {len(segs)}")
        if count == 0:
            return
        start = sum(s.length for s in segs[:after])
        gap = sum(s.length for s in segs[after : after + count])
        end = sum(s.length for s in segs)
        for buffer in (self.k, self.v):
            for src in range(start + gap, end, gap):
                stop = min(src + gap, end)
                buffer[:, :, src - gap : stop - gap].copy_(buffer[:, :, src:stop])
        self._assign(list(range(self.num_layers)), lambda old: old[:after] + old[after + count :])

    def keep(self, layer: int, index: np.ndarray) -> None:
        """Keep only the tokens at ``index`` (ascending) of ``layer``, moved to the front in order."""
        index = np.asarray(index, dtype=np.int64)
        length = self.lengths[layer]
        if index.size and (index[0] < 0 or index[-1] >= length or np.any(np.diff(index) <= 0)):
            raise ValueError("keep needs ascending, distinct token indices within the layer")
        # Tokens already in place (a kept prefix) are not moved.
        moved = np.flatnonzero(index != np.arange(index.size))
        first = int(moved[0]) if moved.size else index.size
        if first < index.size:
            source = host_to_device(index[first:], self.device)
            for buffer in (self.k, self.v):
                buffer[layer, :, first : index.size] = buffer[layer, :, source]
        self._segments[layer] = _compact(self.segments_of(layer), index, self.frame_seq_length)
        self.lengths[layer] = int(index.size)

    def keep_later(
        self, layer: int, index: torch.Tensor, count: int, prefix: int, host_index: Callable[[], np.ndarray]
    ) -> None:
        """``keep`` with the ascending index [count] still on the device.

        The first ``prefix`` tokens stay where they are (``index[:prefix]`` = 0..prefix-1).
        The metadata follows from ``host_index()`` (the same index on the CPU), called only
        when this layer's segments are first read: nothing waits for the device now.
        """
        before = self.segments_of(layer)
        if count > prefix:
            for buffer in (self.k, self.v):
                buffer[layer, :, prefix:count] = buffer[layer, :, index[prefix:count]]
        self._deferred[layer] = _Deferred(before, host_index)
        self.lengths[layer] = int(count)

    def rotate(
        self, first: int, count: int, delta: int, angles: torch.Tensor, layers: Iterable[int] | None = None
    ) -> None:
        """Move segments [first, first + count) to temporal position + ``delta``, in place.

        ``angles`` [P] (float64, on the cache's device) are delta times the temporal
        frequencies: the first P channel pairs (2i, 2i+1) of every head are rotated by
        them, in float64, and cast back to the cache dtype, as Deep Forcing does. Layer
        by layer, so the float64 copy stays small.
        """
        layers = self._layers(layers)
        if delta == 0 or count == 0:
            return
        pairs = angles.shape[0]
        for layer in layers:
            segs = self.segments_of(layer)
            start = sum(s.length for s in segs[:first])
            stop = start + sum(s.length for s in segs[first : first + count])
            chunk = self.k[layer, :, start:stop, :, : 2 * pairs]
            chunk.copy_(rotate_temporal(chunk, angles))
        self.set_positions(first, count, None, layers, delta=delta)

    def relabel(self, first: int, segments: Sequence[Segment], layers: Iterable[int] | None = None) -> None:
        """Metadata only: segments [first, first + len(segments)) are now ``segments``.

        For a policy that overwrote those tokens with the keys of other frames (at other
        positions); the lengths must stay the same.
        """
        segments = tuple(segments)

        def build(old: tuple[Segment, ...]) -> tuple[Segment, ...]:
            replaced = old[first : first + len(segments)]
            if len(replaced) != len(segments) or any(a.length != b.length for a, b in zip(replaced, segments)):
                raise ValueError(f"relabel must keep the lengths of segments {first}..{first + len(segments) - 1}")
            return old[:first] + segments + old[first + len(segments) :]

        self._assign(self._layers(layers), build)

    def set_positions(
        self,
        first: int,
        count: int,
        positions: Sequence[int] | None,
        layers: Iterable[int] | None = None,
        *,
        delta: int = 0,
    ) -> None:
        """Metadata only: segments [first, first + count) now carry ``positions`` (or + delta)."""

        def build(old: tuple[Segment, ...]) -> tuple[Segment, ...]:
            moved = list(old)
            for i in range(first, first + count):
                moved[i] = old[i].moved(old[i].position + delta if positions is None else positions[i - first])
            return tuple(moved)

        self._assign(self._layers(layers), build)


def _token_runs(segments: Sequence[Segment], frames: Sequence[int]) -> list[tuple[int, int]]:
    """[start, stop) buffer ranges of the stored tokens of ``frames``, adjacent ranges joined."""
    wanted, runs, offset = set(frames), [], 0
    for segment in segments:
        if segment.frame in wanted:
            if runs and runs[-1][1] == offset:
                runs[-1] = (runs[-1][0], offset + segment.length)
            else:
                runs.append((offset, offset + segment.length))
        offset += segment.length
    return runs


def _token_metadata(segs: Sequence[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not segs:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    lengths = np.array([s.length for s in segs], dtype=np.int64)
    frames = np.repeat(np.array([s.frame for s in segs], dtype=np.int64), lengths)
    positions = np.repeat(np.array([s.position for s in segs], dtype=np.int64), lengths)
    tokens = np.concatenate([s.token_index() for s in segs])
    return frames, tokens, positions


def _compact(segs: Sequence[Segment], index: np.ndarray, frame_seq_length: int) -> tuple[Segment, ...]:
    """The segments of the tokens at ``index`` (ascending) of ``segs``, frame runs regrouped."""
    frames, tokens, positions = _token_metadata(segs)
    frames, tokens, positions = frames[index], tokens[index], positions[index]
    segments = []
    cuts = np.flatnonzero(np.diff(frames)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, index.size]):
        if hi <= lo:
            continue
        if np.any(positions[lo:hi] != positions[lo]):
            raise ValueError(f"tokens of frame {frames[lo]} carry different RoPE positions")
        run = tokens[lo:hi]
        whole = run.size == frame_seq_length and np.array_equal(run, np.arange(run.size))
        if not whole:
            run = run.copy()
            run.flags.writeable = False
        segments.append(Segment(int(frames[lo]), int(hi - lo), int(positions[lo]), None if whole else run))
    return tuple(segments)

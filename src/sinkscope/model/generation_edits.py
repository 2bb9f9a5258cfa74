"""Edits of a generation's attention and KV cache (``generation.interventions``), as it runs.

``GenerationEdits`` holds a generation's resolved edits (``sinkscope.interventions``: no
``class:`` head selection left) and does them where the model attends, through its cache
policy (``CachePolicy.edits``; None, and nothing runs, when there is no edit):

- attention edits (``mask_keys``, ``logit_bias``): ``frame_bias(layer, layout)`` is the
  [heads, key segments] float32 bias a call adds to its scores (0 untouched, -inf masked),
  built once per (layer, layout object), so once per block and layer; None when no edit
  changes a score of that call (block 0, a layer without edited heads, a bias of 0.0);
- cache edits (``quantize_cache``, ``replace_frames``): done once to each frame when it
  becomes an earlier frame, on the first call of the next block, before the policy makes
  room (``edit_cache``), in every layer, in place on the cache buffers, token by stored
  token (a partly kept frame is edited where it is). A frame that a LongLive re-cache
  rewrote is edited again when the next block starts. Edits apply in the listed order.

Edits touch earlier frames only: a key frame at or after the call's first query frame is
never edited, so block 0 is always the untouched video's.

``quantize_cache`` stores the frames of one finished block as ``CACHE_FORMATS[format]``
reads them back (``sinkscope.model.quantize``): per token, and for the nvfp4 formats one
per-tensor scale over that block's frames of one layer, all heads, K and V apart (as
LongLive 2.0 quantizes one chunk of one layer).

``replace_frames`` overwrites a frame's stored keys and values: with those of a source
frame, snapshotted as the model wrote them when the source became an earlier frame (so
eviction does not lose them) and its keys re-roped from the source's temporal RoPE
position to the replaced frame's (the temporal channels rotated in float64, as
``KVCache.rotate`` does; no rotation under cache-relative policies, whose cache holds keys
before RoPE); or with noise (``source: noise``): per layer, K and V, each (head, channel)
gets a normal draw with the mean and standard deviation of the replaced frame's stored
tokens, drawn on a CPU generator seeded by (seed, frame), so a seed gives the same noise on
every device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sinkscope.attention.biased import remember_rows
from sinkscope.model.cache import KVCache, Segment, host_to_device, rotate_temporal
from sinkscope.model.layout import AttentionLayout
from sinkscope.model.quantize import cache_format
from sinkscope.model.rope import RotaryTables

if TYPE_CHECKING:
    from sinkscope.interventions import Edit, FrameSelection, HeadSelection

MASK_KEYS, LOGIT_BIAS = "mask_keys", "logit_bias"
QUANTIZE_CACHE, REPLACE_FRAMES = "quantize_cache", "replace_frames"
# Mixed into the noise generator's seed, so replacement noise never equals a video's noise stream.
_NOISE_STREAM = 35


class GenerationEdits:
    """One generation's edits, for a model of ``num_layers`` x ``num_heads``; see the module doc.

    ``sink_frames``: the policy's sink frames (``key_frames: sink``); ``rope``: the model's
    tables (re-roping replaced keys); ``raw_keys``: the cache stores keys before RoPE;
    ``seed``: the run's seed (replacement noise).
    """

    def __init__(
        self,
        edits: Iterable[Edit],
        *,
        num_layers: int,
        num_heads: int,
        sink_frames: Sequence[int] = (0,),
        seed: int = 0,
        rope: RotaryTables | None = None,
        raw_keys: bool = False,
    ) -> None:
        self.edits = tuple(edits)
        self.num_layers, self.num_heads = num_layers, num_heads
        self.sink_frames = tuple(int(f) for f in sink_frames)
        self.seed = int(seed)
        self.rope = rope
        self.raw_keys = raw_keys
        # Attention edits: (value added, [layers, heads] bool, frames); a mask adds -inf.
        self._attention: list[tuple[float, np.ndarray, FrameSelection]] = []
        self.cache_edits: list[Edit] = []
        for edit in self.edits:
            if edit.edit in (MASK_KEYS, LOGIT_BIAS):
                value = -np.inf if edit.edit == MASK_KEYS else float(edit.bias)
                if value != 0.0:  # a bias of 0.0 changes no score: it does nothing
                    self._attention.append((value, self._head_mask(edit.heads), edit.key_frames))
            elif edit.edit == QUANTIZE_CACHE:
                cache_format(edit.format)  # a ConfigError for an unknown format, before any work
                self.cache_edits.append(edit)
            elif edit.edit == REPLACE_FRAMES:
                if edit.source != "noise" and not isinstance(edit.source, int):
                    raise ValueError(f"replace_frames: source {edit.source!r} is neither noise nor a frame")
                if edit.source != "noise" and rope is None and not raw_keys:
                    raise ValueError("replace_frames from a frame needs the model's RoPE tables")
                self.cache_edits.append(edit)
            else:
                raise ValueError(f"unknown edit {edit.edit!r}")
        self._sources = {int(e.source) for e in self.cache_edits if e.edit == REPLACE_FRAMES and e.source != "noise"}
        # Layers with an edited head: every other layer's calls are untouched.
        self._bias_layers = frozenset(
            int(layer) for _, heads, _ in self._attention for layer in np.flatnonzero(heads.any(axis=1))
        )
        self.reset()

    def reset(self) -> None:
        """A new video: no snapshot, no memo, nothing pending."""
        self._bias_memo: dict[tuple[int, int], tuple[AttentionLayout, torch.Tensor | None]] = {}
        self._bias_tensors: dict[tuple[int, bytes], torch.Tensor] = {}
        # Source frame -> (per layer (k, v) [B, fsl, H, D], the temporal position its keys carry).
        self._snapshots: dict[int, tuple[list[tuple[torch.Tensor, torch.Tensor]], int]] = {}
        self._rewritten: set[int] = set()

    def _head_mask(self, selection: HeadSelection) -> np.ndarray:
        if selection.kind == "class":
            raise ValueError(f"heads class:{selection.head_class} must be resolved to a list before generating")
        mask = np.zeros((self.num_layers, self.num_heads), dtype=bool)
        for layer, head in selection.resolve(self.num_layers, self.num_heads):
            if not (0 <= layer < self.num_layers and 0 <= head < self.num_heads):
                raise ValueError(
                    f"head L{layer + 1}H{head + 1} is not in a model of {self.num_layers} layers x {self.num_heads} "
                    "heads"
                )
            mask[layer, head] = True
        return mask

    # -- attention edits -------------------------------------------------------------------

    @property
    def edits_attention(self) -> bool:
        """Whether some call's scores change (a mask, or a nonzero bias)."""
        return bool(self._attention)

    def frame_bias(
        self, layer: int, layout: AttentionLayout, device: torch.device | str = "cpu"
    ) -> torch.Tensor | None:
        """[heads, key segments] float32 on ``device``: what this call adds to its scores per
        (head, key frame segment); None when it adds nothing. Built once per (layer, layout)."""
        if layer not in self._bias_layers:
            return None
        key = (layer, id(layout))
        hit = self._bias_memo.get(key)
        if hit is not None and hit[0] is layout:
            return hit[1]
        bias = self._build_bias(layer, layout)
        tensor = None
        if bias is not None:
            # Layers with the same bias share one tensor (the edited attention reads each
            # tensor's values on the host once).
            same = (id(layout), bias.tobytes())
            tensor = self._bias_tensors.get(same)
            if tensor is None:
                # A normal tensor, not an inference tensor: it outlives the call that made it,
                # and its readers may check its version counter.
                with torch.inference_mode(False):
                    tensor = self._bias_tensors[same] = host_to_device(bias, torch.device(device))
                remember_rows(tensor, bias.tolist())  # read by edited_attention without a device sync
        if len(self._bias_memo) >= 4 * self.num_layers:
            self._bias_memo.clear()
            self._bias_tensors.clear()
        self._bias_memo[key] = (layout, tensor)  # keeps the layout alive, so its id stays unique
        return tensor

    def _build_bias(self, layer: int, layout: AttentionLayout) -> np.ndarray | None:
        first_query = min(layout.query_frames)
        frames = layout.key_frames
        bias = np.zeros((self.num_heads, len(frames)), dtype=np.float32)
        earlier = [frame for frame in frames if frame < first_query]
        for value, heads, selection in self._attention:
            rows = np.flatnonzero(heads[layer])
            chosen = set(selection.resolve(earlier, self.sink_frames))
            cols = [i for i, frame in enumerate(frames) if frame in chosen]
            if rows.size and cols:
                bias[np.ix_(rows, cols)] += np.float32(value)
        return bias if np.any(bias != 0) else None

    # -- cache edits -------------------------------------------------------------------------

    def frames_rewritten(self, frames: Iterable[int]) -> None:
        """A re-cache call rewrote the keys of ``frames``: edit them again at the next block."""
        self._rewritten.update(int(f) for f in frames)

    def edit_cache(self, cache: KVCache, frames: Sequence[int]) -> None:
        """``frames`` (a finished block's) just became earlier frames: snapshot the sources among
        them, then do every cache edit on them (and on re-cached frames) in every layer."""
        frames = sorted(set(int(f) for f in frames))
        rewritten = sorted(self._rewritten - set(frames))
        self._rewritten = set()
        if not self.cache_edits:
            return
        for source in sorted(self._sources.intersection(frames)):
            self._snapshot(cache, source)
        for group in (frames, rewritten):
            if group:
                for edit in self.cache_edits:
                    if edit.edit == QUANTIZE_CACHE:
                        cache.quantize_frames(group, edit.format, edit.tensors)
                    else:
                        for frame in edit.key_frames.resolve(group, self.sink_frames):
                            self._replace(cache, frame, edit.source)

    def _snapshot(self, cache: KVCache, frame: int) -> None:
        per_layer, position = [], None
        for layer in range(cache.num_layers):
            start, segment = _whole_segment(cache, layer, frame)
            if position is not None and segment.position != position:
                raise ValueError(
                    f"replace_frames: source frame {frame} sits at different RoPE positions in different layers"
                )
            position = segment.position
            stop = start + segment.length
            per_layer.append((cache.k[layer, :, start:stop].clone(), cache.v[layer, :, start:stop].clone()))
        self._snapshots[frame] = (per_layer, position)

    def _replace(self, cache: KVCache, frame: int, source: Any) -> None:
        if source != "noise" and int(source) not in self._snapshots:
            raise ValueError(f"replace_frames: source frame {source} is not an earlier frame when frame {frame} is")
        generator = None
        if source == "noise":
            state = np.random.SeedSequence([self.seed, frame, _NOISE_STREAM]).generate_state(2)
            generator = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
        for layer in range(cache.num_layers):
            offset = 0
            for segment in cache.segments_of(layer):
                if segment.frame == frame:
                    place = slice(offset, offset + segment.length)
                    if generator is not None:
                        k, v = (
                            _noise_like(buffer[layer, :, place], segment, cache.frame_seq_length, generator)
                            for buffer in (cache.k, cache.v)
                        )
                    else:
                        k, v = self._moved_source(layer, int(source), segment, cache)
                    cache.write(layer, offset, k, v)
                offset += segment.length

    def _moved_source(
        self, layer: int, source: int, segment: Segment, cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The source's snapshot at the segment's stored tokens, keys re-roped to its position."""
        per_layer, position = self._snapshots[source]
        k, v = per_layer[layer]
        if not segment.whole:
            index = host_to_device(segment.tokens.copy(), k.device)
            k, v = k[:, index], v[:, index]
        delta = segment.position - position
        if delta != 0 and not self.raw_keys:
            k = rotate_temporal(k, self.rope.temporal_angles(delta, k.device))
        return k, v


def _whole_segment(cache: KVCache, layer: int, frame: int) -> tuple[int, Segment]:
    offset = 0
    for segment in cache.segments_of(layer):
        if segment.frame == frame and segment.whole:
            return offset, segment
        offset += segment.length
    raise ValueError(
        f"replace_frames: source frame {frame} is not held whole in layer {layer} when it becomes an earlier frame"
    )


def _noise_like(
    stored: torch.Tensor, segment: Segment, frame_seq_length: int, generator: torch.Generator
) -> torch.Tensor:
    """Seeded normal noise [B, n, H, D] with ``stored``'s per-(head, channel) mean and std
    over its tokens; a whole frame is drawn, the segment's tokens taken from it."""
    batch, _, heads, dim = stored.shape
    draw = torch.randn((batch, frame_seq_length, heads, dim), generator=generator)
    if not segment.whole:
        draw = draw[:, torch.from_numpy(segment.tokens.copy())]
    work = torch.float64 if stored.dtype == torch.float64 else torch.float32
    values = stored.to(work)
    mean = values.mean(dim=1, keepdim=True)
    std = values.std(dim=1, keepdim=True, correction=0)
    return (mean + std * draw.to(stored.device, work)).to(stored.dtype)

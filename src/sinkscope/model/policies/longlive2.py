"""LongLive 2.0's KV cache (L ``wan_5b/modules/causal_model.py`` 457-781, 1371-1483;
``pipeline/causal_diffusion_inference.py`` 532-699, 974-1033), on its chunk procedure
(``sinkscope.generation.longlive2``).

The cache holds W frames (their ``local_attn_size``, 32) and a call attends every frame it
holds (``max_attention_size`` is the cache: the window always starts at slot 0). The first
S frames (``sink_size`` = ``global_sink_size``, 8) are the global sink. A chunk whose
prompt marks a scene cut is pinned after its clean pass: its first min(S, chunk) frames
become the shot sink. While the pin sits right after the global sink it is kept with it
(the rolls keep ``S + pin`` frames); a pin elsewhere ("floating") is not protected but
moves down with every roll until it reaches that place; a new cut replaces it.

On the first call of a chunk that would overflow W, the frames after the protected prefix
are evicted FIFO and the rest moves left (their roll). Keys are stored after RoPE, at
their frame plus ``shot_rope_offset`` x the shot index (their ``multi_shot_rope_offset``;
the queries too), or, with ``use_relative_rope``, before RoPE and roped at their slot
0 .. n-1 at every call with the queries at the last slots, without the shot offset.

``kv_quant`` (their NVFP4 cache, scale rule ``mse``: ``CACHE_FORMATS["nvfp4_4over6"]``):
a chunk's stored keys and values are quantized once it is an earlier chunk (when the next
one starts; their cache stores every pass's write quantized, and the clean pass writes
last), one block of one layer at a time, through ``KVCache.quantize_frames`` (the ``quantize_cache`` edit's primitive).
The current chunk's own keys are not quantized but mean-centred over head_dim
(``smooth_keys``, their ``k_smooth``); the stored keys are quantized without centring,
as their cache update stores ``key_to_cache``, not the centred copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from sinkscope.model.cache import KVCache, whole_frames
from sinkscope.model.policies.base import CachePolicy, PolicySettings, WindowPolicy, register_policy
from sinkscope.model.policies.sinks import RelativeRope
from sinkscope.model.quantize import smooth_keys
from sinkscope.model.rope import RotaryTables
from sinkscope.options import LONGLIVE2

# Their multi_shot_rope_offset (configs/inference.yaml): temporal RoPE positions added per shot.
SHOT_ROPE_OFFSET = 8
# Their kv_quant_scale_rule default, "mse": NVFP4 with the four-over-six block scales.
KV_QUANT_FORMAT = "nvfp4_4over6"


@register_policy
class LongLive2Policy(WindowPolicy):
    """LongLive 2.0's window with its global sink and scene-cut sink (module docstring).

    The window part is ``WindowPolicy``'s FIFO, which keeps the global sink, and the pin
    while it sits right after it (``protected_frames``); with their ``use_relative_rope``
    the relative-RoPE part joins (``LongLive2RelativePolicy``, built by ``new_policy``).
    The procedure announces a scene cut with ``begin_shot()`` before the chunk's first call
    and pins it with ``pin_block()`` after its clean pass.
    """

    name = LONGLIVE2
    settings_keys = ("window_frames", "sink_frames")
    use_relative_rope = False

    @classmethod
    def build(cls, cache: KVCache, settings: PolicySettings, options: Mapping[str, Any]) -> CachePolicy:
        chosen = LongLive2RelativePolicy if options.get("use_relative_rope") else LongLive2Policy
        return super(LongLive2Policy, chosen).build(cache, settings, options)

    def __init__(
        self,
        cache: KVCache,
        *,
        window_frames: int,
        sink_frames: int,
        rope: RotaryTables | None = None,
        use_relative_rope: bool = False,
        kv_quant: bool = False,
        shot_rope_offset: int = SHOT_ROPE_OFFSET,
    ) -> None:
        if not 1 <= sink_frames < window_frames:
            raise ValueError(
                f"cache_policy {self.name!r} needs 1 <= sink_frames < window_frames, got {sink_frames}, {window_frames}"
            )
        if bool(use_relative_rope) != self.use_relative_rope:
            raise ValueError(
                f"{type(self).__name__} {'does not rope' if use_relative_rope else 'ropes'} keys at their slot: "
                "build it with new_policy"
            )
        self.kv_quant = bool(kv_quant)
        self.shot_rope_offset = int(shot_rope_offset)
        super().__init__(cache, window_frames=window_frames, sink_frames=sink_frames, rope=rope)

    def reset(self) -> None:
        super().reset()
        self.shot = 0
        # The shot sink: (first slot, frames), or None (their pinned_start / pinned_len).
        self.pin: tuple[int, int] | None = None

    # -- the procedure's announcements -------------------------------------------------------

    def begin_shot(self) -> None:
        """The next chunk starts a new shot (its prompt marks a scene cut): RoPE offset + 1 shot."""
        self.shot += 1

    def pin_block(self) -> None:
        """After the clean pass of a scene-cut chunk: its first min(S, chunk) frames become the shot sink."""
        if self.block_start is None:
            raise ValueError("no chunk to pin before the first one")
        self.pin = (self._held() - self.block_frames, min(self.sink_frames, self.block_frames))

    # -- positions ---------------------------------------------------------------------------

    @property
    def temporal_offset(self) -> int:
        """Temporal RoPE positions added to this shot's frames (0 under relative RoPE)."""
        return 0 if self.use_relative_rope else self.shot * self.shot_rope_offset

    @property
    def protected_frames(self) -> int:
        """Frames at the front a roll keeps: the global sink, and the pin when it sits right after it."""
        if self.pin is not None and self.pin[0] == self.sink_frames:
            return self.sink_frames + self.pin[1]
        return self.sink_frames

    @property
    def query_position_shift(self) -> int:
        return 0 if self.block_start is None else self.temporal_offset

    # -- the cache -----------------------------------------------------------------------------

    def finish_block(self) -> None:
        super().finish_block()
        if self.kv_quant:
            # The finished chunk as the NVFP4 cache reads it back, every layer in place: the
            # same cache primitive as the quantize_cache edit (sinkscope.model.generation_edits).
            self.cache.quantize_frames(
                range(self.block_start, self.block_start + self.block_frames), KV_QUANT_FORMAT, "both"
            )

    def rolled(self, start: int, evicted: int) -> None:
        if self.pin is not None and self.pin[0] >= self.protected_frames:
            self.pin = (self.pin[0] - evicted, self.pin[1])  # a floating pin follows the roll

    def _append_block(self, start: int, frames: int) -> None:
        offset = self.temporal_offset
        self.cache.append(
            whole_frames(
                range(start, start + frames),
                self.frame_seq_length,
                positions=range(start + offset, start + frames + offset),
            )
        )

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, raw_k: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.cache.write_tail(layer, k, v)  # (no re-cache calls: the policy takes none)
        keys, values = self.cache.keys(layer)
        if self.kv_quant:
            # The current chunk's keys enter the softmax mean-centred, not quantized.
            keys = torch.cat([keys[:, : keys.shape[1] - k.shape[1]], smooth_keys(k)], dim=1)
        return keys, values


class LongLive2RelativePolicy(RelativeRope, LongLive2Policy):
    """LongLive 2.0's cache with their ``use_relative_rope``: the window part's cache holding
    keys before RoPE, each roped at its slot at every call with the queries at the last
    slots (``RelativeRope``), without the shot offset; NVFP4's centring comes before RoPE."""

    use_relative_rope = True

"""Deep Forcing's participative compression: the deep sink plus top-C token selection."""

from __future__ import annotations

import math

import numpy as np
import torch

from sinkscope.model.cache import KVCache, host_to_device
from sinkscope.model.policies.base import (
    MAX_REUSE,
    CachePolicy,
    register_policy,
)
from sinkscope.model.rope import RotaryTables
from sinkscope.options import (
    PARTICIPATIVE,
)


@register_policy
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
    settings_keys = ("window_frames", "sink_frames", "budget_frames", "recent_frames", "max_reuse")

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
        # Every frame that was a top-C candidate (``chosen_frames``).
        self._candidates: set[int] = set()

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

    def chosen_frames(self, layer: int) -> frozenset[int]:
        """Every frame that was a top-C candidate: which of its tokens stay depends on the
        scores (at their own positions)."""
        return frozenset(self._candidates)

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
        offset = 0
        for segment in self.cache.segments_of(layer):  # the candidates' frames, [sink, old_end)
            if offset < old_end and offset + segment.length > sink:
                self._candidates.add(segment.frame)
            offset += segment.length
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

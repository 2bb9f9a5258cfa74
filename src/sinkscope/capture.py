"""Per-call frame statistics of chosen layers while a video is generated.

``FrameStatsCapture`` hooks the self-attention of the chosen layers (the q and k that
the softmax sees, with the cache's absolute frame indices), turns every call into
frame-level logit_mean and prob_mass right away (nothing token-level is kept), and
keeps the results on the device until the generation ends, so capturing costs no
host synchronization per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from .generation import CallInfo
from .model import WanModel
from .stats import frame_attention_stats


@dataclass
class _Record:
    layer: int
    call: CallInfo
    query_frames: list[int]
    key_frames: list[int]
    logit_mean: torch.Tensor
    prob_mass: torch.Tensor


class FrameStatsCapture:
    """Context manager: attach to ``layers`` of ``model``, collect one record per call."""

    def __init__(
        self,
        model: WanModel,
        layers: Sequence[int],
        *,
        frame_seq_length: int,
        backend: str = "auto",
    ) -> None:
        num_layers = model.config.num_layers
        bad = [layer for layer in layers if not 0 <= layer < num_layers]
        if bad:
            raise ValueError(f"layers {bad} do not exist; the model has layers 0..{num_layers - 1}")
        self.model = model
        self.layers = sorted(set(int(layer) for layer in layers))
        self.frame_seq_length = frame_seq_length
        self.backend = backend
        self.records: list[_Record] = []
        self._call: CallInfo | None = None

    def __enter__(self) -> "FrameStatsCapture":
        for layer in self.layers:
            self.model.set_observer(layer, self._observer(layer))
        return self

    def __exit__(self, *exc: object) -> None:
        for layer in self.layers:
            self.model.set_observer(layer, None)

    def begin_call(self, info: CallInfo) -> None:
        self._call = info

    def _observer(self, layer: int):
        def observe(q: torch.Tensor, k: torch.Tensor, query_frames: list[int], key_frames: list[int]) -> None:
            if self._call is None:
                raise RuntimeError("a captured attention call ran outside a generation")
            if q.shape[0] != 1:
                raise ValueError(f"capture expects batch size 1, got {q.shape[0]}")
            logit_mean, prob_mass = frame_attention_stats(
                q[0].transpose(0, 1),
                k[0].transpose(0, 1),
                frame_seq_length=self.frame_seq_length,
                query_frames=query_frames,
                key_frames=key_frames,
                backend=self.backend,
            )
            self.records.append(_Record(layer, self._call, query_frames, key_frames, logit_mean, prob_mass))

        return observe

    def to_frame(self) -> pd.DataFrame:
        """frame_attention rows (without the checkpoint/prompt/seed columns), one per
        layer x call x head x query frame x key frame."""
        if not self.records:
            return pd.DataFrame(columns=list(ROW_COLUMNS))
        # One device-to-host copy for the whole generation.
        flat = torch.cat([torch.cat([r.logit_mean.flatten(), r.prob_mass.flatten()]) for r in self.records]).cpu().numpy()
        sizes = np.array([r.logit_mean.numel() for r in self.records])
        starts = np.concatenate([[0], np.cumsum(2 * sizes)[:-1]])
        # (head, query frame, key frame) grids repeat across layers and steps: build each once.
        grids: dict[tuple, tuple[np.ndarray, ...]] = {}
        parts: list[tuple[np.ndarray, ...]] = []
        for record in self.records:
            key = (record.logit_mean.shape[0], tuple(record.query_frames), tuple(record.key_frames))
            if key not in grids:
                grids[key] = tuple(g.ravel() for g in np.meshgrid(np.arange(key[0]), key[1], key[2], indexing="ij"))
            parts.append(grids[key])
        calls = [r.call for r in self.records]
        passes = sorted({c.pass_ for c in calls})
        columns = {
            "layer": np.repeat([r.layer for r in self.records], sizes),
            "head": np.concatenate([p[0] for p in parts]),
            "block": np.repeat([c.block for c in calls], sizes),
            "pass": pd.Categorical.from_codes(np.repeat([passes.index(c.pass_) for c in calls], sizes), passes),
            "step": np.repeat([c.step for c in calls], sizes),
            "timestep": np.repeat([c.timestep for c in calls], sizes),
            "query_frame": np.concatenate([p[1] for p in parts]),
            "key_frame": np.concatenate([p[2] for p in parts]),
            "logit_mean": np.concatenate([flat[s : s + n] for s, n in zip(starts, sizes)]),
            "prob_mass": np.concatenate([flat[s + n : s + 2 * n] for s, n in zip(starts, sizes)]),
        }
        return pd.DataFrame(columns)


ROW_COLUMNS = (
    "layer",
    "head",
    "block",
    "pass",
    "step",
    "timestep",
    "query_frame",
    "key_frame",
    "logit_mean",
    "prob_mass",
)

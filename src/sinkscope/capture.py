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
        flat = torch.cat([torch.cat([r.logit_mean.flatten(), r.prob_mass.flatten()]) for r in self.records]).cpu()
        columns: dict[str, list[np.ndarray]] = {name: [] for name in ROW_COLUMNS}
        offset = 0
        for record in self.records:
            heads, nq, nk = record.logit_mean.shape
            cells = heads * nq * nk
            head, qf, kf = np.meshgrid(
                np.arange(heads), np.asarray(record.query_frames), np.asarray(record.key_frames), indexing="ij"
            )
            call = record.call
            columns["layer"].append(np.full(cells, record.layer))
            columns["head"].append(head.ravel())
            columns["block"].append(np.full(cells, call.block))
            columns["pass"].append(np.full(cells, call.pass_, dtype=object))
            columns["step"].append(np.full(cells, call.step))
            columns["timestep"].append(np.full(cells, call.timestep))
            columns["query_frame"].append(qf.ravel())
            columns["key_frame"].append(kf.ravel())
            columns["logit_mean"].append(flat[offset : offset + cells].numpy())
            columns["prob_mass"].append(flat[offset + cells : offset + 2 * cells].numpy())
            offset += 2 * cells
        return pd.DataFrame({name: np.concatenate(parts) for name, parts in columns.items()})


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

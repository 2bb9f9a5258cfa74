"""Demo checkpoints in Self-Forcing's layout: ``generator_ema`` (+ ``generator``) state
dicts with keys prefixed ``model.``, the step, and sinkscope's training metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from sinkscope.io import atomic_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


FINAL_NAME = "final.pt"


FORMAT_VERSION = 1


def _state_for_saving(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {f"model.{k}": v.detach().to("cpu", dtype).clone() for k, v in model.state_dict().items()}


def _plain(metadata: dict) -> dict:
    """Metadata as plain JSON types, so torch.load(weights_only=True) reads the file."""
    return json.loads(json.dumps(metadata))


def save_checkpoint(
    path: str | Path,
    *,
    ema_model: torch.nn.Module,
    model: torch.nn.Module | None,
    step: int,
    metadata: dict,
    dtype: torch.dtype | str = torch.float32,
) -> Path:
    """Write a Self-Forcing-layout .pt: generator_ema (+ generator), step, sinkscope."""
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    data: dict[str, Any] = {"generator_ema": _state_for_saving(ema_model, dtype)}
    if model is not None:
        data["generator"] = _state_for_saving(model, dtype)
    data["step"] = int(step)
    data["sinkscope"] = _plain({**metadata, "step": int(step), "weights_dtype": str(dtype).removeprefix("torch.")})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(data, tmp)
    return path


def export_checkpoint(
    source: str | Path, dest: str | Path, *, dtype: str | torch.dtype = "bfloat16", keep_generator: bool = False
) -> Path:
    """A smaller copy of a training checkpoint: generator_ema (+ generator) in ``dtype``."""
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    data = torch.load(source, map_location="cpu", weights_only=True)
    out: dict[str, Any] = {"generator_ema": {k: v.to(dtype) for k, v in data["generator_ema"].items()}}
    if keep_generator and "generator" in data:
        out["generator"] = {k: v.to(dtype) for k, v in data["generator"].items()}
    out["step"] = data.get("step", 0)
    meta = dict(data.get("sinkscope", {}))
    meta["weights_dtype"] = str(dtype).removeprefix("torch.")
    out["sinkscope"] = _plain(meta)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest) as tmp:
        torch.save(out, tmp)
    return dest

"""What every launcher of the statistics kernels shares (``sinkscope.stats.launch``, the kernels
over the scores; ``sinkscope.stats.reductions``, the reductions): the settings of Triton's CPU
interpreter, where the tests run the kernels, the loop bounds it needs, and the key frames'
layout on the device, cached per layout."""

from __future__ import annotations

import os
from functools import lru_cache

import torch

# Small tiles for Triton's CPU interpreter (tests): fast, and every masking path taken.
# Under the interpreter the loops run to compile-time bounds (see _interpreter_loop_end).
INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 16}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _launch_config(config: dict | None, default: dict) -> tuple[dict, dict]:
    """(kernel meta-parameters, launch options): ``config`` over the default."""
    config = {**(INTERPRETER_CONFIG if _interpreting() else default), **(config or {})}
    launch = {key: config.pop(key) for key in ("num_warps", "num_stages") if key in config}
    return config, launch


def _interpreter_loop_end(end: int) -> int:
    """The kernels' LOOP_END: 0 on the GPU (each loop runs to its runtime bound); in
    Triton's interpreter the bound itself, as a compile-time constant. The interpreter of
    Triton 3.6 and earlier turns runtime loop bounds (even plain int arguments) into
    1-element arrays that NumPy >= 2.4 refuses to convert to an int."""
    return end if _interpreting() else 0


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


@lru_cache(maxsize=256)
def _segments_on(device: torch.device, key_lengths: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(starts int32, lengths int32, lengths fp32) on ``device``; cached, since a handful
    of layouts repeat over every layer and step (and a host-to-device copy can stall)."""
    starts = [0]
    for length in key_lengths[:-1]:
        starts.append(starts[-1] + length)
    lengths = torch.tensor(key_lengths, dtype=torch.int32)
    return (
        torch.tensor(starts, dtype=torch.int32).to(device),
        lengths.to(device),
        lengths.float().to(device),
    )


@lru_cache(maxsize=256)
def _frame_ends_on(device: torch.device, key_lengths: tuple[int, ...]) -> torch.Tensor:
    """Each key frame's end in k (int32) on ``device``; cached per layout."""
    return torch.tensor(key_lengths, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)

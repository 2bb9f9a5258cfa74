"""Quantization formats of the KV cache, as fake quantization: the values attention reads back.

One registry, ``CACHE_FORMATS``, of small ``CacheFormat`` entries found by name. Each entry
says how many bits a stored value takes, which values share a scale, rounds a tensor the
way a cache of that format would store and dequantize it (``roundtrip``) and gives the
exact bytes such a cache holds (``storage_bytes``, for the memory estimate). The values are
never packed: the cache keeps the model dtype and only the numbers change.

Rules (docs/cache-quantization.md):

- ``int8``, ``int4``, ``fp8_e4m3``: one symmetric scale per row of the last dim (one token of
  one head), ``scale = absmax(row) / qmax`` with qmax 127, 7 and 448; integers round half to
  even and clamp to ``[-qmax, qmax]``; fp8 rounds ``x / scale`` to float8_e4m3fn. The scale
  is stored as float32 (4 bytes a row).
- ``nvfp4`` (NVIDIA's NVFP4): E2M1 values in blocks of 16 along the last dim, an E4M3 block
  scale per block and one float32 scale per tensor: ``g = amax(tensor) / (6 * 448)``, block
  scale ``s = e4m3(absmax(block) / 6 / g)``, value ``e2m1(x / (s * g)) * s * g``. E2M1 rounds
  to the nearest of {0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to the even code, and saturates at 6
  (a block scale rounded down, or subnormal, can put ``|x / (s g)|`` above 6).
- ``nvfp4_4over6``: the block-scale rule LongLive 2.0's NVFP4 KV cache uses ("four over
  six", its ``kv_quant_scale_rule: mse``): ``g = amax / (6 * 256)``; each block is quantized
  with the scale ``e4m3(absmax / 6 / g)`` and with ``e4m3(absmax / 4 / g)`` and keeps the
  one whose squared error over the block is smaller (6 on a tie).
- ``smooth_keys`` is LongLive 2.0's ``k_smooth``: each key row minus its mean over head_dim,
  applied before quantizing (and, in LongLive, to the current block's keys as well).

"Tensor" for nvfp4 means the tensor handed to ``roundtrip``: LongLive 2.0 quantizes one
chunk-sized block of one layer's K (or V), all heads, per call; pass the same to match it.

Arithmetic runs in float32 (float64 for float64 input, so tests can compare exactly against
a float64 reference); the result has the input's dtype and device. Rows and blocks of zeros
give zeros. Non-finite input is propagated, not refused (a refusal would cost a device sync
on every cache write): NaN or inf turns its whole scale group into NaN, and for the nvfp4
formats, whose per-tensor scale is the amax, the whole tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from types import MappingProxyType

import torch
from torch import Tensor

from sinkscope.errors import ConfigError

E2M1_MAX = 6.0
E4M3_MAX = 448.0
FOUR_OVER_SIX_E4M3_MAX = 256.0  # LongLive's fouroversix keeps block scales <= 256 * 1.5 = 384
NVFP4_BLOCK = 16
TENSORS = ("k", "v", "both")


def _work_dtype(x: Tensor) -> torch.dtype:
    if not x.is_floating_point():
        raise TypeError(f"cache quantization needs a float tensor, got {x.dtype}")
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _over(x: Tensor, constant: float) -> Tensor:
    """``x / constant`` as a true division on every device (CUDA multiplies by the
    reciprocal of a Python number, which differs from CPU in the last bit)."""
    return x / torch.full_like(x, constant)


def round_e2m1(y: Tensor) -> Tensor:
    """``y`` rounded to the E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} (with sign): nearest value,
    ties to the even code, saturating at 6. NaN stays NaN."""
    a = y.abs().clamp(max=E2M1_MAX)
    # the grid's spacing is 0.5 below 2, 1 below 4 and 2 up to 6; on each stretch an even
    # multiple of the spacing is an even code (mantissa bit 0), so round-half-even of the
    # multiple is round-half-even of the code
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).to(a.dtype)
    return torch.copysign(torch.round(a / step) * step, y)


def round_e4m3(y: Tensor) -> Tensor:
    """``y`` rounded to float8_e4m3fn (nearest, ties to even, saturating at +-448), in y's dtype."""
    return y.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(y.dtype)


def _row_absmax_roundtrip(qmax: float, rounding: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    def roundtrip(x: Tensor) -> Tensor:
        w = x.to(_work_dtype(x))
        scale = _over(w.abs().amax(dim=-1, keepdim=True), qmax)
        safe = torch.where(scale == 0, torch.ones_like(scale), scale)  # a zero row stays zero, NaN stays NaN
        q = rounding((w / safe).clamp(-qmax, qmax))
        return (q * safe).to(x.dtype)

    return roundtrip


def _nvfp4_blocks(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The work-dtype blocks of 16 [..., n, 16], their absmax [..., n, 1] and the tensor's amax."""
    if x.shape[-1] % NVFP4_BLOCK:
        raise ConfigError(f"quantize_cache: nvfp4 needs a head_dim divisible by {NVFP4_BLOCK}, got {x.shape[-1]}")
    w = x.to(_work_dtype(x))
    blocks = w.reshape(*w.shape[:-1], w.shape[-1] // NVFP4_BLOCK, NVFP4_BLOCK)
    return blocks, blocks.abs().amax(dim=-1, keepdim=True), w.abs().amax()


def _nvfp4_values(blocks: Tensor, block_scale: Tensor, global_scale: Tensor) -> Tensor:
    """Dequantized blocks for E4M3 block scales ``block_scale`` (0 where the scale is 0)."""
    scale = block_scale * global_scale
    zero = scale == 0  # written so that a NaN scale gives NaN, not 0
    safe = torch.where(zero, torch.ones_like(scale), scale)
    return torch.where(zero, torch.zeros_like(blocks), round_e2m1(blocks / safe) * safe)


def _global_scale(amax: Tensor, e4m3_max: float) -> Tensor:
    g = _over(amax, E2M1_MAX * e4m3_max)
    return torch.where(amax == 0, torch.ones_like(g), g)  # an all-zero tensor: every block scale is 0


def _nvfp4(x: Tensor) -> Tensor:
    blocks, block_amax, amax = _nvfp4_blocks(x)
    g = _global_scale(amax, E4M3_MAX)
    out = _nvfp4_values(blocks, round_e4m3(_over(block_amax, E2M1_MAX) / g), g)
    return out.reshape(x.shape).to(x.dtype)


def _nvfp4_4over6(x: Tensor) -> Tensor:
    blocks, block_amax, amax = _nvfp4_blocks(x)
    g = _global_scale(amax, FOUR_OVER_SIX_E4M3_MAX)
    to_six = _nvfp4_values(blocks, round_e4m3(_over(block_amax, E2M1_MAX) / g), g)
    to_four = _nvfp4_values(blocks, round_e4m3(_over(block_amax, 4.0) / g), g)
    four_better = ((to_four - blocks) ** 2).sum(-1, keepdim=True) < ((to_six - blocks) ** 2).sum(-1, keepdim=True)
    return torch.where(four_better, to_four, to_six).reshape(x.shape).to(x.dtype)


@dataclass(frozen=True)
class CacheFormat:
    """One cache quantization format: its name, bits per value, what shares a scale."""

    name: str
    bits: int  # bits of one stored value
    group: str  # which values share one scale, in words
    group_size: int | None  # values per scale; None: one row of the last dim
    scale_bytes: int  # bytes of one group's scale
    tensor_scale_bytes: int  # bytes of the per-tensor scale (0: none)
    _roundtrip: Callable[[Tensor], Tensor] = field(repr=False, compare=False)

    def roundtrip(self, x: Tensor) -> Tensor:
        """``x`` as this format stores it and reads it back: same shape, dtype and device."""
        return self._roundtrip(x) if x.numel() else x.clone()

    def storage_bytes(self, shape: Sequence[int]) -> int:
        """Exact bytes a cache tensor of ``shape`` takes in this format (values packed, scales
        unpadded; nvfp4: one per-tensor scale per call of ``roundtrip`` on that shape)."""
        numel, last = prod(shape), shape[-1]
        rows = numel // last if last else 0
        groups = rows if self.group_size is None else numel // self.group_size
        # values are packed per row: an odd head_dim in int4 leaves half a byte a row
        value_bytes = rows * -(-last * self.bits // 8)
        return value_bytes + groups * self.scale_bytes + self.tensor_scale_bytes


CACHE_FORMATS: Mapping[str, CacheFormat] = MappingProxyType(
    {
        entry.name: entry
        for entry in (
            CacheFormat(
                "int8",
                8,
                "one token of one head (a row of head_dim)",
                None,
                4,
                0,
                _row_absmax_roundtrip(127.0, torch.round),
            ),
            CacheFormat(
                "int4",
                4,
                "one token of one head (a row of head_dim)",
                None,
                4,
                0,
                _row_absmax_roundtrip(7.0, torch.round),
            ),
            CacheFormat(
                "fp8_e4m3",
                8,
                "one token of one head (a row of head_dim)",
                None,
                4,
                0,
                _row_absmax_roundtrip(E4M3_MAX, round_e4m3),
            ),
            CacheFormat(
                "nvfp4",
                4,
                "16 consecutive values of a row (E4M3 scale), plus one FP32 scale a tensor",
                NVFP4_BLOCK,
                1,
                4,
                _nvfp4,
            ),
            CacheFormat(
                "nvfp4_4over6",
                4,
                "as nvfp4; each block's scale targets 6 or 4, whichever errs less",
                NVFP4_BLOCK,
                1,
                4,
                _nvfp4_4over6,
            ),
        )
    }
)


def cache_format(name: str) -> CacheFormat:
    """The registered format ``name``; a ConfigError naming the known ones otherwise."""
    if name not in CACHE_FORMATS:
        raise ConfigError(f"quantize_cache: format {name!r} is not one of {', '.join(CACHE_FORMATS)}")
    return CACHE_FORMATS[name]


def smooth_keys(k: Tensor) -> Tensor:
    """LongLive 2.0's ``k_smooth``: each key row minus its mean over head_dim, in k's dtype."""
    return k - k.mean(dim=-1, keepdim=True)


def quantize_cache(
    k: Tensor, v: Tensor, format: str, tensors: str = "both", *, smooth: bool = False
) -> tuple[Tensor, Tensor]:
    """Keys and values as a cache of ``format`` returns them; ``tensors`` (k, v, both) says
    which are quantized. ``smooth`` mean-centres the keys first (whether or not they are
    quantized), as LongLive 2.0 does with its NVFP4 cache."""
    entry = cache_format(format)
    if tensors not in TENSORS:
        raise ConfigError(f"quantize_cache: tensors {tensors!r} is not one of {', '.join(TENSORS)}")
    if smooth:
        k = smooth_keys(k)
    if tensors in ("k", "both"):
        k = entry.roundtrip(k)
    if tensors in ("v", "both"):
        v = entry.roundtrip(v)
    return k, v

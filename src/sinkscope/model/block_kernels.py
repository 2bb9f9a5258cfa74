"""Triton kernels for the memory-bound work of a Wan block (``KernelSettings.fused_norms``).

Eager PyTorch runs a block's norms, modulations, gates and RoPE as a dozen elementwise
kernels a layer, each reading and writing a [tokens, dim] tensor, some in float32; Inductor
fuses them, but its reductions here run far from the memory's speed (docs/performance.md).
Each kernel below reads its inputs once and writes its outputs once, one program a token:

- ``modulated_norm``: Wan's ``norm(x) * (1 + scale) + shift`` (LayerNorm without affine, the
  frame's modulation);
- ``residual_norm``: ``x + y * gate`` (the gate optional), then, of the new residual stream
  as it is stored, a LayerNorm with its affine (Wan's ``norm3``) or with the frame's
  modulation (``norm2``);
- ``gated_residual``: ``x + y * gate`` alone (after the FFN);
- ``qk_norm_rope``: the q/k RMSNorm over the full width with its weight, then RoPE on each
  head's interleaved channel pairs (or no RoPE: the cross-attention's queries).

Everything is computed in float32 from the stored inputs and rounded once to the output
dtype, where eager rounds after each operation: outputs differ from eager's by a bf16
rounding, and are closer to the float64 result (``tests/test_block_kernels.py``).

Eager only: a compiled block keeps Inductor's own fusion (``model.wan.fused_norms_apply``).
The kernels take their per-frame tables' strides as arguments; as ``torch.library.triton_op``s
under ``torch.compile`` (tried: 1.01-1.04x faster) they would rely on Inductor handing them
inputs with the strides it traced, which it promises only in stride order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# What ``residual_norm_kernel`` normalizes after the residual add.
NORM_NONE, NORM_AFFINE, NORM_MODULATED = 0, 1, 2


@triton.jit
def residual_norm_kernel(
    x_ptr,
    y_ptr,
    gate_ptr,
    first_ptr,
    second_ptr,
    x_out_ptr,
    h_out_ptr,
    dim,
    tokens,
    tokens_per_frame,
    stride_mb,
    stride_mf,
    eps,
    HAS_Y: tl.constexpr,
    HAS_GATE: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One token: x (+ y (* gate)); then its norm. ``first``/``second``: the affine's weight and
    bias (NORM 1, [dim]) or the frame's shift and scale (NORM 2, like the gate: rows of
    [B, F, ..., dim] at ``stride_mb``/``stride_mf``)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < dim
    frame_row = (row // tokens) * stride_mb + ((row % tokens) // tokens_per_frame) * stride_mf
    x = tl.load(x_ptr + row * dim + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_Y:
        y = tl.load(y_ptr + row * dim + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_GATE:
            y = y * tl.load(gate_ptr + frame_row + offs, mask=mask, other=0.0).to(tl.float32)
        stored = (x + y).to(x_out_ptr.dtype.element_ty)
        tl.store(x_out_ptr + row * dim + offs, stored, mask=mask)
        # The norm reads the residual stream as stored, as the next layer's will.
        x = stored.to(tl.float32)
    if NORM != 0:
        mean = tl.sum(x, axis=0) / dim
        centered = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / dim + eps)
        h = centered * rstd
        if NORM == 1:
            h = h * tl.load(first_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            h = h + tl.load(second_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            shift = tl.load(first_ptr + frame_row + offs, mask=mask, other=0.0).to(tl.float32)
            scale = tl.load(second_ptr + frame_row + offs, mask=mask, other=0.0).to(tl.float32)
            h = h * (1.0 + scale) + shift
        tl.store(h_out_ptr + row * dim + offs, h.to(h_out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def qk_norm_rope_kernel(
    x_ptr,
    weight_ptr,
    rope_ptr,
    out_ptr,
    dim,
    tokens,
    half_head,
    eps,
    HAS_ROPE: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """One token of q or k [tokens, dim]: RMSNorm over dim, its weight, then each head's
    channel pairs (2i, 2i+1) rotated by the token's (cos, sin) of pair i
    (``rope`` [tokens, half_head, 2], float32)."""
    row = tl.program_id(0).to(tl.int64)
    pairs = tl.arange(0, BLOCK_P)
    mask = pairs < dim // 2
    base = x_ptr + row * dim + 2 * pairs
    even = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    odd = tl.load(base + 1, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(even * even + odd * odd, axis=0) / dim + eps)
    even = even * rstd * tl.load(weight_ptr + 2 * pairs, mask=mask, other=0.0).to(tl.float32)
    odd = odd * rstd * tl.load(weight_ptr + 2 * pairs + 1, mask=mask, other=0.0).to(tl.float32)
    if HAS_ROPE:
        angle = rope_ptr + ((row % tokens) * half_head + pairs % half_head) * 2
        cos = tl.load(angle, mask=mask, other=1.0)
        sin = tl.load(angle + 1, mask=mask, other=0.0)
        even, odd = even * cos - odd * sin, even * sin + odd * cos
    out = out_ptr + row * dim + 2 * pairs
    tl.store(out, even.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out + 1, odd.to(out_ptr.dtype.element_ty), mask=mask)


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 4096 else 16


def _frame_table(tables: list[torch.Tensor | None], x: torch.Tensor) -> tuple[int, int, int]:
    """Tokens a frame and the batch and frame strides of the per-frame row tables [B, F, dim]
    (views of the model's [B, F, 6, dim] modulation) given, checked against x [B, L, dim]."""
    present = [t for t in tables if t is not None]
    if not present:
        return x.shape[1], 0, 0
    first = present[0]
    for table in present:
        if table.ndim != 3 or table.shape != (x.shape[0], first.shape[1], x.shape[2]) or table.stride(2) != 1:
            raise ValueError(
                f"a per-frame table of shape {tuple(table.shape)} does not fit x of shape {tuple(x.shape)}"
            )
        if table.stride()[:2] != first.stride()[:2]:
            raise ValueError("the per-frame tables of one call must share their strides")
    if x.shape[1] % first.shape[1]:
        raise ValueError(f"{x.shape[1]} tokens do not split into {first.shape[1]} frames")
    return x.shape[1] // first.shape[1], first.stride(0), first.stride(1)


def _residual_norm(
    x: torch.Tensor,
    y: torch.Tensor | None,
    gate: torch.Tensor | None,
    first: torch.Tensor | None,
    second: torch.Tensor | None,
    norm: int,
    eps: float,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The launch behind the three functions below: (the new residual stream or None without
    ``y``, the norm's output or None without one)."""
    batch, tokens, dim = x.shape
    x = x.contiguous()
    per_frame = [gate] + ([first, second] if norm == NORM_MODULATED else [])
    tokens_per_frame, stride_mb, stride_mf = _frame_table(per_frame, x)
    x_out = torch.empty_like(x) if y is not None else None
    h_out = torch.empty_like(x) if norm != NORM_NONE else None
    block = triton.next_power_of_2(dim)
    residual_norm_kernel[(batch * tokens,)](
        x,
        y.contiguous() if y is not None else x,
        gate if gate is not None else x,
        first if first is not None else x,
        second if second is not None else x,
        x_out if x_out is not None else x,
        h_out if h_out is not None else x,
        dim,
        tokens,
        tokens_per_frame,
        stride_mb,
        stride_mf,
        eps,
        HAS_Y=y is not None,
        HAS_GATE=gate is not None,
        NORM=norm,
        BLOCK_D=block,
        num_warps=_warps(block),
    )
    return x_out, h_out


def modulated_norm(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm (no affine) of x [B, L, dim], times ``1 + scale``, plus ``shift`` (each
    [B, F, dim]: a row per frame of L / F tokens)."""
    return _residual_norm(x, None, None, shift, scale, NORM_MODULATED, eps)[1]


def residual_norm(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor | None = None,
    *,
    affine: tuple[torch.Tensor, torch.Tensor] | None = None,
    modulation: tuple[torch.Tensor, torch.Tensor] | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x + y * gate`` (``gate`` [B, F, dim], or None: ``x + y``) and the LayerNorm of that
    sum as stored, with ``affine`` (weight, bias) or ``modulation`` (shift, scale:
    ``* (1 + scale) + shift``; [B, F, dim] as the gate)."""
    if (affine is None) == (modulation is None):
        raise ValueError("residual_norm takes an affine or a modulation")
    norm, (first, second) = (NORM_AFFINE, affine) if affine is not None else (NORM_MODULATED, modulation)
    return _residual_norm(x, y, gate, first, second, norm, eps)


def gated_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """``x + y * gate`` (``gate`` [B, F, dim], or None: ``x + y``), rounded once."""
    return _residual_norm(x, y, gate, None, None, NORM_NONE, 0.0)[0]


def qk_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, rope: torch.Tensor | None, heads: int, eps: float
) -> torch.Tensor:
    """RMSNorm of x [B, L, dim] over dim with ``weight``, then RoPE (``rope``: the model's
    [L, 1, head_dim / 2, 2] (cos, sin) table) on each of ``heads`` heads' interleaved pairs;
    ``rope`` None: the norm alone."""
    batch, tokens, dim = x.shape
    x = x.contiguous()
    half_head = dim // heads // 2
    if rope is not None:
        rope = rope.reshape(-1, half_head, 2).to(torch.float32).contiguous()
        if rope.shape[0] != tokens:
            raise ValueError(f"a RoPE table of {rope.shape[0]} tokens does not fit {tokens}")
    out = torch.empty_like(x)
    block = triton.next_power_of_2(dim // 2)
    qk_norm_rope_kernel[(batch * tokens,)](
        x,
        weight,
        rope if rope is not None else x,
        out,
        dim,
        tokens,
        half_head,
        eps,
        HAS_ROPE=rope is not None,
        BLOCK_P=block,
        num_warps=_warps(block),
    )
    return out

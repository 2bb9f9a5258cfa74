"""The Triton kernel that merges key-split attention parts (``sinkscope.attention.split``).

One program per (BLOCK_L queries, head, batch entry): it reads every part's log-sum-exp
and output rows once, and writes the merged rows in the model's [B, L, H, D] layout, so
the self-attention's output projection reads them without a copy. The parts may come from
two tensors (``extra``: an edited call's biased key frames, attended apart, merged with the
key-split parts of the rest without copying them into one tensor first).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def merge_parts_kernel(
    out_ptr,
    lse_ptr,
    extra_ptr,
    extra_lse_ptr,
    merged_ptr,
    merged_lse_ptr,
    stride_on,
    stride_oh,
    stride_ol,
    stride_en,
    stride_eh,
    stride_el,
    stride_mb,
    stride_ml,
    stride_mh,
    num_q,
    heads,
    PARTS: tl.constexpr,
    EXTRA_PARTS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    pid_l = tl.program_id(0)
    head = tl.program_id(1)
    batch = tl.program_id(2)
    offs_l = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    offs_d = tl.arange(0, D_PAD)
    rows = offs_l < num_q
    tile = rows[:, None] & (offs_d < HEAD_DIM)[None, :]
    top = tl.full([BLOCK_L], float("-inf"), tl.float32)
    for part in tl.static_range(PARTS):
        entry = batch * PARTS + part
        top = tl.maximum(top, tl.load(lse_ptr + (entry * heads + head) * num_q + offs_l, mask=rows, other=0.0))
    for part in tl.static_range(EXTRA_PARTS):
        entry = batch * EXTRA_PARTS + part
        top = tl.maximum(top, tl.load(extra_lse_ptr + (entry * heads + head) * num_q + offs_l, mask=rows, other=0.0))
    total = tl.zeros([BLOCK_L], tl.float32)
    acc = tl.zeros([BLOCK_L, D_PAD], tl.float32)
    for part in tl.static_range(PARTS):
        entry = batch * PARTS + part
        weight = tl.exp(tl.load(lse_ptr + (entry * heads + head) * num_q + offs_l, mask=rows, other=0.0) - top)
        rows_out = tl.load(
            out_ptr + entry * stride_on + head * stride_oh + offs_l[:, None] * stride_ol + offs_d[None, :],
            mask=tile,
            other=0.0,
        )
        total += weight
        acc += weight[:, None] * rows_out.to(tl.float32)
    for part in tl.static_range(EXTRA_PARTS):
        entry = batch * EXTRA_PARTS + part
        weight = tl.exp(tl.load(extra_lse_ptr + (entry * heads + head) * num_q + offs_l, mask=rows, other=0.0) - top)
        rows_out = tl.load(
            extra_ptr + entry * stride_en + head * stride_eh + offs_l[:, None] * stride_el + offs_d[None, :],
            mask=tile,
            other=0.0,
        )
        total += weight
        acc += weight[:, None] * rows_out.to(tl.float32)
    merged = acc / total[:, None]
    tl.store(
        merged_ptr + batch * stride_mb + offs_l[:, None] * stride_ml + head * stride_mh + offs_d[None, :],
        merged.to(merged_ptr.dtype.element_ty),
        mask=tile,
    )
    tl.store(merged_lse_ptr + (batch * heads + head) * num_q + offs_l, top + tl.log(total), mask=rows)


def merge_parts_cuda(
    out: torch.Tensor,
    lse: torch.Tensor,
    batch: int,
    parts: int,
    merged: torch.Tensor | None = None,
    extra: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sinkscope.attention.split.merge_parts`` in one launch."""
    _, heads, num_q, dim = out.shape
    if out.stride(-1) != 1:
        out = out.contiguous()
    lse = lse.reshape(batch * parts, heads, num_q).contiguous()
    extra_parts = 0
    extra_out, extra_lse = out, lse  # placeholders the kernel never reads without extra parts
    if extra is not None:
        extra_out, extra_lse = extra
        extra_parts = extra_out.shape[0] // batch
        if extra_out.stride(-1) != 1:
            extra_out = extra_out.contiguous()
        extra_lse = extra_lse.reshape(batch * extra_parts, heads, num_q).contiguous()
    if merged is None:
        merged = torch.empty(batch, num_q, heads, dim, dtype=out.dtype, device=out.device)
    elif merged.stride(-1) != 1:
        raise ValueError("merge_parts_cuda writes into a tensor with a unit-stride last dimension only")
    merged_lse = torch.empty(batch, heads, num_q, dtype=torch.float32, device=out.device)
    block_l = 32 if dim > 64 else 64
    grid = (triton.cdiv(num_q, block_l), heads, batch)
    merge_parts_kernel[grid](
        out,
        lse,
        extra_out,
        extra_lse,
        merged,
        merged_lse,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        extra_out.stride(0),
        extra_out.stride(1),
        extra_out.stride(2),
        merged.stride(0),
        merged.stride(1),
        merged.stride(2),
        num_q,
        heads,
        PARTS=parts,
        EXTRA_PARTS=extra_parts,
        HEAD_DIM=dim,
        D_PAD=max(16, triton.next_power_of_2(dim)),
        BLOCK_L=block_l,
        num_warps=4,
    )
    return merged, merged_lse

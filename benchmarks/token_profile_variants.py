"""Other shapes of the token-profile pass (per key token, the sum over every query of p_ij given
each query's log-sum-exp), timed against ``sinkscope.stats.launch.token_profile_sums`` at the
1.3B's last block and LongLive 2.0's last chunk (random bf16, the shapes of ``frame_route.py``).
None is faster (docs/performance.md, "The token profiles' pass"); the script keeps the record.

Section ``triton``. The package's kernel holds a key tile as the product's N side and streams
query tiles as its M side; its sums run down the M side, so it keeps a [queries x keys]
accumulator and adds it up after the loop. The variants here (``_keys_major_kernel``) put the
keys on the M side: each thread's share of a key's sum is its own, the accumulator is a column,
and the registers it frees let more programs share a multiprocessor. One set of constexprs each:

- ``BLOCK_K`` keys held a program, ``BLOCK_Q`` queries a step;
- ``PIPELINE``: the product of the next query tile issued before the exponentials of this one;
- ``ROWSUM``: the sums taken every step (else a [keys x queries] accumulator, summed after).

Each row: ms a call (20 queued), the ratio to the package's kernel timed in the same process,
the largest difference of the sums from the package's relative to its largest sum, and the
compiled kernel's registers, spills and shared memory.

Section ``flash4``. The same sums as one call of FlashAttention-4's forward with the roles
swapped (``augmented_inputs``: the keys as its queries, the queries as its keys, each query's
log-sum-exp folded into three extra columns), so that its log-sum-exp of row j is
log(sum_i p_ij); ms of its call alone and with the inputs built, per input width and value
width. Then two bounds, not the statistic: FlashAttention-4 on the swapped and on the model's
own orientation without the offsets, with 16 and 128 value columns.

    PYTHONPATH=src python benchmarks/token_profile_variants.py [--sections triton,flash4] --out $OUT/variants.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from frame_route import SHAPES, queued_ms, shape_inputs  # noqa: E402

from sinkscope.stats.launch import sdpa_with_lse, token_profile_sums  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit
def _keys_major_kernel(
    q_ptr,
    k_ptr,
    lse2_ptr,
    prob_ptr,
    stride_qh,
    stride_ql,
    stride_kh,
    stride_kl,
    num_queries,
    num_keys,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    PIPELINE: tl.constexpr,
    ROWSUM: tl.constexpr,
):
    pid = tl.program_id(0)
    head = tl.program_id(1)
    offs_k = pid * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, HEAD_DIM)
    k = tl.load(
        k_ptr + head * stride_kh + offs_k[:, None] * stride_kl + offs_d[None, :],
        mask=(offs_k < num_keys)[:, None],
        other=0.0,
    )
    q_base = q_ptr + head * stride_qh + offs_d[:, None]
    lse_base = lse2_ptr + head * num_queries
    acc = tl.zeros([BLOCK_K], tl.float32)
    acc2 = tl.zeros([BLOCK_K, BLOCK_Q], tl.float32)
    if PIPELINE:
        offs_q = tl.arange(0, BLOCK_Q)
        q_t = tl.load(q_base + offs_q[None, :] * stride_ql, mask=(offs_q < num_queries)[None, :], other=0.0)
        s = tl.dot(k, q_t)
        for start in range(0, num_queries, BLOCK_Q):
            offs_n = start + BLOCK_Q + tl.arange(0, BLOCK_Q)
            q_t = tl.load(q_base + offs_n[None, :] * stride_ql, mask=(offs_n < num_queries)[None, :], other=0.0)
            s_next = tl.dot(k, q_t)
            offs_q = start + tl.arange(0, BLOCK_Q)
            lse2 = tl.load(lse_base + offs_q, mask=offs_q < num_queries, other=float("inf"))
            p = tl.exp2(s * qk_scale_log2 - lse2[None, :])
            if ROWSUM:
                acc += tl.sum(p, 1)
            else:
                acc2 += p
            s = s_next
    else:
        for start in range(0, num_queries, BLOCK_Q):
            offs_q = start + tl.arange(0, BLOCK_Q)
            q_t = tl.load(q_base + offs_q[None, :] * stride_ql, mask=(offs_q < num_queries)[None, :], other=0.0)
            lse2 = tl.load(lse_base + offs_q, mask=offs_q < num_queries, other=float("inf"))
            p = tl.exp2(tl.dot(k, q_t) * qk_scale_log2 - lse2[None, :])
            if ROWSUM:
                acc += tl.sum(p, 1)
            else:
                acc2 += p
    if not ROWSUM:
        acc = tl.sum(acc2, 1)
    tl.store(prob_ptr + head * num_keys + offs_k, acc, mask=offs_k < num_keys)


def keys_major_sums(q, k, lse2, scale, block_k, block_q, warps, stages, pipeline, rowsum) -> tuple:
    """(the sums [H, Lk] fp32, the compiled kernel) of one ``_keys_major_kernel`` launch."""
    heads, num_queries, head_dim = q.shape
    num_keys = k.shape[1]
    prob = torch.empty(heads, num_keys, dtype=torch.float32, device=q.device)
    compiled = _keys_major_kernel[(triton.cdiv(num_keys, block_k), heads)](
        q,
        k,
        lse2,
        prob,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        num_queries,
        num_keys,
        scale * LOG2E,
        HEAD_DIM=head_dim,
        BLOCK_K=block_k,
        BLOCK_Q=block_q,
        PIPELINE=pipeline,
        ROWSUM=rowsum,
        num_warps=warps,
        num_stages=stages,
    )
    return prob, compiled


# (BLOCK_K, BLOCK_Q, num_warps, num_stages)
TILES = [
    (128, 64, 4, 2),
    (128, 64, 4, 3),
    (128, 128, 8, 2),
    (128, 128, 8, 3),
    (256, 64, 8, 2),
    (256, 64, 8, 3),
    (256, 128, 8, 2),
]


def shape_case(name: str, shape: dict) -> tuple:
    """(q, k [H, L, D], each query's natural log-sum-exp [H, Lq], the scale, the package's sums,
    its ms a call) at ``shape``."""
    _, (q, k, v), _, _ = shape_inputs(shape)
    q, k, v = (x.contiguous() for x in (q, k, v))
    scale = 128**-0.5
    _, lse = sdpa_with_lse(q, k, v, scale)
    lse2 = (lse * LOG2E).contiguous()
    package_ms = queued_ms(lambda: token_profile_sums(q, k, lse2, scale))[0]
    print(name, "package", f"{package_ms:.3f} ms", flush=True)
    return q, k, lse, scale, token_profile_sums(q, k, lse2, scale)[0], package_ms


def measure(name: str, shape: dict, tiles: list, flags: list) -> dict:
    q, k, lse, scale, reference, package_ms = shape_case(name, shape)
    lse2 = (lse * LOG2E).contiguous()
    entry: dict = {"shape": shape, "package_ms": round(package_ms, 4), "variants": []}
    for block_k, block_q, warps, stages in tiles:
        for pipeline, rowsum in flags:
            row = dict(BLOCK_K=block_k, BLOCK_Q=block_q, num_warps=warps, num_stages=stages)
            row.update(PIPELINE=pipeline, ROWSUM=rowsum)

            def run():
                return keys_major_sums(q, k, lse2, scale, block_k, block_q, warps, stages, pipeline, rowsum)

            try:
                sums, compiled = run()
                error = ((sums - reference).abs().max() / reference.abs().max()).item()
                ms = queued_ms(run)[0]
                row.update(ms=round(ms, 4), x_package=round(ms / package_ms, 4), max_rel_diff=error)
                row.update(registers=compiled.n_regs, spills=compiled.n_spills, smem=compiled.metadata.shared)
            except Exception as failure:  # noqa: BLE001 - out of resources for a tile: report, go on
                row["error"] = f"{type(failure).__name__}: {str(failure)[:200]}"
            entry["variants"].append(row)
            print(name, row, flush=True)
    # the package's kernel again, at the end: the machine's drift over the section
    entry["package_ms_after"] = round(queued_ms(lambda: token_profile_sums(q, k, lse2, scale))[0], 4)
    return entry


def augmented_inputs(q, k, lse, scale, width):
    """The token profiles as one attention call of FlashAttention-4 with the roles swapped: the
    keys as its queries (rows), the queries as its keys, each row's log-sum-exp then
    log(sum_i p_ij). The [L, H, width] inputs: rows [k_j, 1, 1, 1, 0...], columns
    [q_i, -lse_i / scale in three bf16 parts, 0...], so that scale times their product is
    scale q_i . k_j - lse_i to float32 rounding."""
    heads, num_queries, dim = q.shape
    rows = torch.zeros(1, k.shape[1], heads, width, dtype=k.dtype, device=k.device)
    rows[0, :, :, :dim] = k.transpose(0, 1)
    rows[0, :, :, dim : dim + 3] = 1
    cols = torch.zeros(1, num_queries, heads, width, dtype=q.dtype, device=q.device)
    cols[0, :, :, :dim] = q.transpose(0, 1)
    rest = -lse.transpose(0, 1).float() / scale
    for part in range(3):
        piece = rest.to(q.dtype)
        cols[0, :, :, dim + part] = piece
        rest = rest - piece.float()
    return rows, cols


WIDTHS = (136, 144)
VALUE_WIDTHS = (8, 16, 32)


def measure_flash4(name: str, shape: dict, widths: tuple, value_widths: tuple) -> dict:
    """FlashAttention-4 on the swapped, widened inputs (``augmented_inputs``), per width and value
    width: ms of its call alone and with the inputs built, and the sums' largest difference from
    the package's kernel."""
    from sinkscope.attention.flash4 import flash4_forward

    q, k, lse, scale, reference, package_ms = shape_case(name, shape)
    entry: dict = {"shape": shape, "package_ms": round(package_ms, 4), "flash4": []}
    forward = flash4_forward()
    for width in widths:
        rows, cols = augmented_inputs(q, k, lse, scale, width)
        for value_width in value_widths:
            values = torch.zeros(1, cols.shape[1], cols.shape[2], value_width, dtype=q.dtype, device=q.device)
            row = {"width": width, "value_width": value_width}

            def call():
                return forward(rows, cols, values, softmax_scale=scale, return_lse=True)[1]

            def built():
                rows_, cols_ = augmented_inputs(q, k, lse, scale, width)
                return forward(rows_, cols_, values, softmax_scale=scale, return_lse=True)[1]

            try:
                sums = call()[0].exp()
                row["max_rel_diff"] = ((sums - reference).abs().max() / reference.abs().max()).item()
                row["call_ms"] = round(queued_ms(call)[0], 4)
                row["built_ms"] = round(queued_ms(built)[0], 4)
                row["x_package"] = round(row["built_ms"] / package_ms, 4)
            except Exception as failure:  # noqa: BLE001 - a width FlashAttention-4 refuses: report, go on
                row["error"] = f"{type(failure).__name__}: {str(failure)[:300]}"
            entry["flash4"].append(row)
            print(name, row, flush=True)
    # Bounds, not the statistic: the swapped call without the offsets (width 128), and the
    # model's own orientation with narrow values.
    for label, (a, b) in (("swapped_plain", (k, q)), ("unswapped_plain", (q, k))):
        for value_width in (16, 128):
            values = torch.zeros(1, b.shape[1], b.shape[0], value_width, dtype=q.dtype, device=q.device)
            a4, b4 = (x.transpose(0, 1)[None] for x in (a, b))
            ms = queued_ms(lambda: forward(a4, b4, values, softmax_scale=scale, return_lse=True))[0]
            entry[f"{label}_v{value_width}_ms"] = round(ms, 4)
            print(name, label, value_width, f"{ms:.3f} ms", flush=True)
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--sections", default="triton,flash4")
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    parser.add_argument("--value-widths", default=",".join(map(str, VALUE_WIDTHS)))
    args = parser.parse_args()
    sections = args.sections.split(",")
    widths = tuple(int(x) for x in args.widths.split(",") if x)
    value_widths = tuple(int(x) for x in args.value_widths.split(",") if x)
    flags = [(False, True), (True, True), (False, False)]
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    for name in args.shapes.split(","):
        if "triton" in sections:
            results[name] = measure(name, SHAPES[name], TILES, flags)
        if "flash4" in sections:
            results[f"{name}_flash4"] = measure_flash4(name, SHAPES[name], widths, value_widths)
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

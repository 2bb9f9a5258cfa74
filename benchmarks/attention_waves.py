"""Where the last block's attention time goes: wave quantization, key splits, token_profiles_kernel's bounds.

At the last block's shape (12 heads x 4680 queries x 32760 keys, head size 128, bf16) an
attention kernel with 128-query tiles launches 12 x 37 = 444 programs on the H100's 132
SMs: 3.4 waves, so the fourth wave runs about a third full. Three sections:

- ``waves``: SDPA's time over a range of query counts (keys fixed), in ms and TFLOP/s: a
  staircase says the kernel is quantized by waves.
- ``split``: ``sinkscope.attention.split.balanced_attention`` (the plan of
  ``key_split``: queries that fill whole waves in one call, the rest with their keys in
  equal parts run as batch entries of one cuDNN call, merged exactly by their
  log-sum-exps) and every query over two key parts, against SDPA, per cache length,
  with the output's deviation.
- ``profiles``: ``token_profiles_kernel`` per launch configuration, and diagnostic
  variants of it that say what bounds it: the exponential replaced by a polynomial on the
  FMA units for all or half of the columns, or left out (not a statistic; a bound).

    PYTHONPATH=src python benchmarks/attention_waves.py --out waves.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from captured_call import queued_ms  # noqa: E402
from gpu_benchmark import last_block_inputs  # noqa: E402

from sinkscope.attention.split import (  # noqa: E402
    balanced_attention,
    key_split,
    split_key_attention,
)
from sinkscope.stats.launch import token_profile_sums  # noqa: E402

HEADS, DIM, FSL = 12, 128, 1560


def tflops(num_q: int, num_k: int, ms: float, passes: int = 2) -> float:
    """TFLOP/s of ``passes`` matrix products of [Lq, D] x [D, Lk] per head."""
    return 2 * passes * HEADS * num_q * num_k * DIM / (ms * 1e-3) / 1e12


def section_waves(query_counts: list[int], num_k: int) -> list[dict]:
    rows = []
    for num_q in query_counts:
        q = torch.randn(1, HEADS, num_q, DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, HEADS, num_k, DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        ms = queued_ms(lambda: F.scaled_dot_product_attention(q, k, v))
        rows.append({"queries": num_q, "keys": num_k, "ms": ms, "tflops": tflops(num_q, num_k, ms)})
        print(f"waves  Lq {num_q:5d}  {ms:.3f} ms  {rows[-1]['tflops']:.0f} TFLOP/s", flush=True)
    return rows


def section_split(key_frames: list[int]) -> list[dict]:
    """SDPA against ``balanced_attention`` (the plan of ``key_split``) and against every query
    split in two key parts, per cache length."""
    rows = []
    for frames in key_frames:
        q4, k4, v4 = last_block_inputs(num_k=frames)
        sdpa = lambda: F.scaled_dot_product_attention(q4.transpose(1, 2), k4.transpose(1, 2), v4.transpose(1, 2))  # noqa: E731
        reference = sdpa().transpose(1, 2)
        plan = key_split(q4, k4)
        row = {
            "key_frames": frames,
            "plan": {"head": plan.head, "parts": plan.parts, "waves": plan.waves},
            "sdpa_ms": queued_ms(sdpa),
        }
        for name, attend in (
            ("planned", lambda: balanced_attention(q4, k4, v4)),
            ("two_parts", lambda: split_key_attention(q4, k4, v4, 2)[0]),
        ):
            out = attend()
            row[f"{name}_ms"] = queued_ms(attend)
            row[f"{name}_max_abs_diff"] = (out.float() - reference.float()).abs().max().item()
        rows.append(row)
        print(
            f"split  {frames:2d} key frames  plan {plan.head} + {plan.parts} parts  SDPA {row['sdpa_ms']:.3f} ms  "
            f"planned {row['planned_ms']:.3f} ms ({row['planned_ms'] / row['sdpa_ms']:.3f}x)  two parts "
            f"{row['two_parts_ms']:.3f} ms  max |diff| {row['planned_max_abs_diff']:.2e}",
            flush=True,
        )
    return rows


@triton.jit
def _exp2_fma(x):
    """2^x on the FMA units (x <= 0): 2^floor(x) by the exponent bits, 2^frac by a degree-5 polynomial."""
    x = tl.maximum(x, -126.0)
    whole = tl.floor(x)
    f = x - whole
    p = 1.8775767e-3
    p = p * f + 8.9893397e-3
    p = p * f + 5.5826318e-2
    p = p * f + 2.4015361e-1
    p = p * f + 6.9315308e-1
    p = p * f + 1.0
    bits = p.to(tl.int32, bitcast=True) + (whole.to(tl.int32) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _profile_probe_kernel(
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MODE: tl.constexpr,
):
    # MODE 0: exp2 on the MUFU; 1: polynomial for every column; 2: polynomial for half; 3: no exponential.
    HALF: tl.constexpr = BLOCK_N // 2
    pid_n = tl.program_id(0)
    head = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_a = pid_n * BLOCK_N + tl.arange(0, HALF)
    offs_b = offs_a + HALF
    k_a = tl.load(
        k_ptr + head * stride_kh + offs_a[None, :] * stride_kl + offs_d[:, None],
        mask=offs_a[None, :] < num_keys,
        other=0.0,
    )
    k_b = tl.load(
        k_ptr + head * stride_kh + offs_b[None, :] * stride_kl + offs_d[:, None],
        mask=offs_b[None, :] < num_keys,
        other=0.0,
    )
    acc_a = tl.zeros([BLOCK_M, HALF], tl.float32)
    acc_b = tl.zeros([BLOCK_M, HALF], tl.float32)
    for start in range(0, num_queries, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        m_valid = offs_m < num_queries
        q = tl.load(
            q_ptr + head * stride_qh + offs_m[:, None] * stride_ql + offs_d[None, :], mask=m_valid[:, None], other=0.0
        )
        lse2 = tl.load(lse2_ptr + head * num_queries + offs_m, mask=m_valid, other=float("inf"))
        t_a = tl.dot(q, k_a) * qk_scale_log2 - lse2[:, None]
        t_b = tl.dot(q, k_b) * qk_scale_log2 - lse2[:, None]
        if MODE == 0:
            acc_a += tl.exp2(t_a)
            acc_b += tl.exp2(t_b)
        elif MODE == 1:
            acc_a += _exp2_fma(t_a)
            acc_b += _exp2_fma(t_b)
        elif MODE == 2:
            acc_a += tl.exp2(t_a)
            acc_b += _exp2_fma(t_b)
        else:
            acc_a += t_a
            acc_b += t_b
    tl.store(prob_ptr + head * num_keys + offs_a, tl.sum(acc_a, 0), mask=offs_a < num_keys)
    tl.store(prob_ptr + head * num_keys + offs_b, tl.sum(acc_b, 0), mask=offs_b < num_keys)


def section_profiles() -> dict:
    q4, k4, v4 = last_block_inputs()
    q, k = (x[0].transpose(0, 1) for x in (q4, k4))  # [H, L, D]
    scale = DIM**-0.5
    sdpa_ms = queued_ms(
        lambda: F.scaled_dot_product_attention(q4.transpose(1, 2), k4.transpose(1, 2), v4.transpose(1, 2))
    )
    from sinkscope.stats.launch import sdpa_with_lse

    _, lse = sdpa_with_lse(q, k, v4[0].transpose(0, 1), scale)
    lse2 = (lse * 1.4426950408889634).contiguous()
    reference = token_profile_sums(q, k, lse2, scale)[0]
    result = {"sdpa_ms": sdpa_ms, "token_profiles": [], "probes": []}
    for block_m in (32, 64):
        for block_n in (128, 256):
            for warps in (4,):
                for stages in (2, 3, 4):
                    config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}
                    try:
                        ms = queued_ms(lambda: token_profile_sums(q, k, lse2, scale, config))
                    except Exception as error:  # out of resources for this tile
                        print(f"token_profiles {config}: {type(error).__name__}", flush=True)
                        continue
                    result["token_profiles"].append({**config, "ms": ms, "x_sdpa": ms / sdpa_ms})
                    print(f"token_profiles {config}  {ms:.3f} ms  {ms / sdpa_ms:.2f}x SDPA", flush=True)
    prob = torch.empty(HEADS, k.shape[1], device="cuda", dtype=torch.float32)
    for mode, name in enumerate(("mufu", "fma_all", "fma_half", "no_exp")):
        for block_m, block_n, warps, stages in ((64, 128, 4, 3), (64, 256, 8, 3)):
            grid = (triton.cdiv(k.shape[1], block_n), HEADS)

            def launch():
                _profile_probe_kernel[grid](
                    q,
                    k,
                    lse2,
                    prob,
                    q.stride(0),
                    q.stride(1),
                    k.stride(0),
                    k.stride(1),
                    q.shape[1],
                    k.shape[1],
                    scale * 1.4426950408889634,
                    HEAD_DIM=DIM,
                    BLOCK_M=block_m,
                    BLOCK_N=block_n,
                    MODE=mode,
                    num_warps=warps,
                    num_stages=stages,
                )

            try:
                ms = queued_ms(launch)
            except Exception as error:
                print(f"probe {name} {block_m}x{block_n}: {type(error).__name__}", flush=True)
                continue
            error = (prob - reference).abs().max().item() / reference.abs().max().item() if mode < 3 else None
            result["probes"].append(
                {
                    "mode": name,
                    "BLOCK_M": block_m,
                    "BLOCK_N": block_n,
                    "num_warps": warps,
                    "num_stages": stages,
                    "ms": ms,
                    "x_sdpa": ms / sdpa_ms,
                    "max_rel_err": error,
                }
            )
            print(
                f"probe {name:8s} {block_m}x{block_n} w{warps} s{stages}  {ms:.3f} ms  {ms / sdpa_ms:.2f}x  err "
                f"{error}",
                flush=True,
            )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="waves,split,profiles")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sections = args.sections.split(",")
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    if "waves" in sections:
        result["waves"] = section_waves([3840, 4096, 4224, 4352, 4608, 4680, 4736, 4864, 5120, 5632, 6144], 32760)
    if "split" in sections:
        result["split"] = section_split([3, 6, 9, 12, 15, 18, 21])
    if "profiles" in sections:
        result["profiles"] = section_profiles()
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The matrix products and the q/k norm + RoPE of one transformer layer at a block's shape (4680 tokens, Wan2.1-1.3B).

Each product of one self-attention layer pass, timed queued (20 calls back to back), bf16:
q, k and v as three products and as one over the concatenated weights; o; the
cross-attention's q; the FFN's two products. Says whether fusing the q/k/v projections
is worth it on this GPU. Section ``norm_rope``: RMSNorm, weight and RoPE of q as the
torch composition (eager and compiled by Inductor) and as one hand-written Triton kernel
(``norm_rope`` below: each program loads a few rows' even and odd channels, takes the RMS
in fp32 and rotates each pair, with the eager composition's roundings), with the GPU time
of their kernels and the share of output values that differ from eager.

    PYTHONPATH=src python benchmarks/block_gemms.py --out gemms.json
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

TOKENS, DIM, FFN = 4680, 1536, 8960


@triton.jit
def norm_rope_kernel(
    x_ptr,
    weight_ptr,
    rope_ptr,
    out_ptr,
    num_rows,
    stride_x,
    stride_out,
    eps,
    WIDTH: tl.constexpr,
    HALF_PAD: tl.constexpr,
    PAIRS_PER_HEAD: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    pair = tl.arange(0, HALF_PAD)
    in_row = pair < WIDTH // 2
    valid = (rows < num_rows)[:, None] & in_row[None, :]
    even_ptr = x_ptr + rows[:, None] * stride_x + 2 * pair[None, :]
    even = tl.load(even_ptr, mask=valid, other=0.0).to(tl.float32)
    odd = tl.load(even_ptr + 1, mask=valid, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt((tl.sum(even * even, 1) + tl.sum(odd * odd, 1)) / WIDTH + eps)
    dtype = out_ptr.dtype.element_ty
    w_even = tl.load(weight_ptr + 2 * pair, mask=in_row, other=0.0).to(tl.float32)
    w_odd = tl.load(weight_ptr + 2 * pair + 1, mask=in_row, other=0.0).to(tl.float32)
    even = ((even * inv_rms[:, None]).to(dtype).to(tl.float32) * w_even[None, :]).to(dtype).to(tl.float32)
    odd = ((odd * inv_rms[:, None]).to(dtype).to(tl.float32) * w_odd[None, :]).to(dtype).to(tl.float32)
    # rope [rows, PAIRS_PER_HEAD, 2] (cos, sin), the same for every head.
    angle_ptr = rope_ptr + rows[:, None] * (2 * PAIRS_PER_HEAD) + 2 * (pair % PAIRS_PER_HEAD)[None, :]
    cos = tl.load(angle_ptr, mask=valid, other=1.0)
    sin = tl.load(angle_ptr + 1, mask=valid, other=0.0)
    out = out_ptr + rows[:, None] * stride_out + 2 * pair[None, :]
    tl.store(out, (even * cos - odd * sin).to(dtype), mask=valid)
    tl.store(out + 1, (even * sin + odd * cos).to(dtype), mask=valid)


def norm_rope(x: torch.Tensor, weight: torch.Tensor, rope: torch.Tensor, eps: float, heads: int) -> torch.Tensor:
    """rope(rmsnorm(x) * weight) of x [B, L, W] (CUDA, fp16 / bf16), rope [L, 1, P, 2] fp32
    with P = W / heads / 2; [B, L, heads, W / heads]."""
    batch, length, width = x.shape
    x2 = x.reshape(batch * length, width)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    pairs = width // heads // 2
    table = rope.reshape(length, pairs, 2).float().contiguous()
    if batch > 1:
        table = table.repeat(batch, 1, 1)
    out = torch.empty(batch * length, width, dtype=x.dtype, device=x.device)
    block_rows = 4
    norm_rope_kernel[(triton.cdiv(batch * length, block_rows),)](
        x2,
        weight,
        table,
        out,
        batch * length,
        x2.stride(0),
        out.stride(0),
        eps,
        WIDTH=width,
        HALF_PAD=triton.next_power_of_2(width // 2),
        PAIRS_PER_HEAD=pairs,
        BLOCK_ROWS=block_rows,
        num_warps=4,
    )
    return out.view(batch, length, heads, width // heads)


def profiled_us(fn, calls: int = 20) -> float:
    """GPU microseconds a call: the kernels' own time under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in kernels) / calls


def section_norm_rope() -> dict:
    from sinkscope.model.wan import RotaryTables, WanRMSNorm, apply_rope

    heads, eps = 12, 1e-6
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(1, TOKENS, DIM, device="cuda", generator=g).bfloat16()
    norm = WanRMSNorm(DIM, eps).cuda().bfloat16()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(DIM, device="cuda", generator=g) + 0.5)
    rope = RotaryTables(DIM // heads).phases(18, 3, 30, 52, torch.device("cuda"), torch.float32)

    def composition(t):
        return apply_rope(norm(t).view(1, TOKENS, heads, DIM // heads), rope)

    compiled = torch.compile(composition)
    reference = composition(x)
    result = {}
    with torch.no_grad():
        for name, run in (
            ("eager", lambda: composition(x)),
            ("inductor", lambda: compiled(x)),
            ("kernel", lambda: norm_rope(x, norm.weight, rope, eps, heads)),
        ):
            out = run()
            result[name] = {
                "us": queued_ms(run) * 1e3,
                "gpu_us": profiled_us(run),
                "differing_share": (out != reference).float().mean().item(),
                "max_abs_diff": (out.float() - reference.float()).abs().max().item(),
            }
            print(
                f"norm_rope {name:9s} {result[name]['us']:7.1f} us queued, {result[name]['gpu_us']:.1f} us of "
                f"kernels; differing {result[name]['differing_share']:.2e}  max |diff| "
                f"{result[name]['max_abs_diff']:.2e}",
                flush=True,
            )
    return result


def section_ffn() -> dict:
    """The FFN's first product and its tanh GELU: two kernels (as the model runs them), or one
    cuBLASLt product with a GELU epilogue (``torch._addmm_activation``), eager and compiled."""
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(TOKENS, DIM, device="cuda", generator=g).bfloat16()
    w = (torch.randn(FFN, DIM, device="cuda", generator=g) * DIM**-0.5).bfloat16()
    b = (torch.randn(FFN, device="cuda", generator=g) * 0.1).bfloat16()

    def two_kernels(t):
        return F.gelu(F.linear(t, w, b), approximate="tanh")

    def epilogue(t):
        return torch._addmm_activation(b, t, w.t(), use_gelu=True)

    reference = two_kernels(x)
    # Which GELU the epilogue computes: at x in [-4, -2] the tanh and erf forms differ by about 10%.
    probe = torch.linspace(-4, -2, 256, device="cuda").bfloat16().reshape(16, 16)
    eye, zero = torch.eye(16, device="cuda").bfloat16(), torch.zeros(16, device="cuda").bfloat16()
    epi = torch._addmm_activation(zero, probe, eye, use_gelu=True).float()
    result = {
        "epilogue_vs_tanh_gelu": (epi - F.gelu(probe.float(), approximate="tanh").bfloat16().float())
        .abs()
        .mean()
        .item(),
        "epilogue_vs_erf_gelu": (epi - F.gelu(probe.float()).bfloat16().float()).abs().mean().item(),
    }
    print(
        f"ffn epilogue mean |diff| against tanh GELU {result['epilogue_vs_tanh_gelu']:.2e}, against erf GELU "
        f"{result['epilogue_vs_erf_gelu']:.2e}",
        flush=True,
    )
    with torch.no_grad():
        for name, fn in (
            ("two kernels", two_kernels),
            ("epilogue", epilogue),
            ("two kernels, compiled", torch.compile(two_kernels)),
            ("epilogue, compiled", torch.compile(epilogue)),
        ):
            out = fn(x)
            result[name] = {
                "gpu_us": profiled_us(lambda: fn(x)),
                "differing_share": (out != reference).float().mean().item(),
                "max_abs_diff": (out.float() - reference.float()).abs().max().item(),
            }
            print(
                f"ffn {name:22s} {result[name]['gpu_us']:7.1f} us of kernels; differing "
                f"{result[name]['differing_share']:.2e}  max |diff| {result[name]['max_abs_diff']:.2e}",
                flush=True,
            )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sections", default="products,norm_rope,ffn")
    args = parser.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)

    def weight(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, device="cuda", generator=g) * cols**-0.5).bfloat16()

    x = torch.randn(1, TOKENS, DIM, device="cuda", generator=g).bfloat16()
    hidden = torch.randn(1, TOKENS, FFN, device="cuda", generator=g).bfloat16()
    wq, wk, wv, wo = (weight(DIM, DIM) for _ in range(4))
    bias = torch.zeros(DIM, device="cuda", dtype=torch.bfloat16)
    w_qkv, b_qkv = torch.cat((wq, wk, wv)), torch.cat((bias, bias, bias))
    w_up, w_down = weight(FFN, DIM), weight(DIM, FFN)
    b_up = torch.zeros(FFN, device="cuda", dtype=torch.bfloat16)
    products = {
        "q, k, v: three products": (lambda: [F.linear(x, w, bias) for w in (wq, wk, wv)], 3 * DIM * DIM),
        "q, k, v: one product": (lambda: F.linear(x, w_qkv, b_qkv).split(DIM, dim=-1), 3 * DIM * DIM),
        "o (and cross-attention q, o)": (lambda: F.linear(x, wo, bias), DIM * DIM),
        "ffn up": (lambda: F.linear(x, w_up, b_up), DIM * FFN),
        "ffn down": (lambda: F.linear(hidden, w_down, bias), DIM * FFN),
    }
    result: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "tokens": TOKENS,
        "products": {},
    }
    if "norm_rope" in args.sections:
        result["norm_rope"] = section_norm_rope()
    if "ffn" in args.sections:
        result["ffn"] = section_ffn()
    separate, fused = F.linear(x, wq, bias), F.linear(x, w_qkv, b_qkv)[..., :DIM]
    result["qkv_fused_equals_separate"] = bool(torch.equal(separate, fused))
    result["qkv_fused_max_abs_diff"] = (separate.float() - fused.float()).abs().max().item()
    for name, (run, weights) in products.items():
        ms = queued_ms(run)
        tflops = 2 * TOKENS * weights / (ms * 1e-3) / 1e12
        result["products"][name] = {"ms": ms, "tflops": tflops}
        print(f"{name:32s} {ms * 1e3:8.1f} us  {tflops:5.0f} TFLOP/s", flush=True)
    print(
        f"fused q equals separate q: {result['qkv_fused_equals_separate']} (max |diff| "
        f"{result['qkv_fused_max_abs_diff']:.2e})"
    )
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

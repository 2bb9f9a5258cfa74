import torch, sys, json
sys.path.insert(0, "src"); sys.path.insert(0, "benchmarks")
from sinkscope.stats import launch
from sinkscope.attention.split import cached_attention
from gpu_benchmark import cuda_time
H, fsl, nk = 24, 880, 40
g = torch.Generator(device="cuda").manual_seed(0)
q4 = torch.randn(1, 8 * fsl, H, 128, device="cuda", generator=g).bfloat16()
k4 = torch.randn(1, nk * fsl, H, 128, device="cuda", generator=g).bfloat16()
v4 = torch.randn(1, nk * fsl, H, 128, device="cuda", generator=g).bfloat16()
q, k, v = (x[0].transpose(0, 1) for x in (q4, k4, v4))
kl = (fsl,) * nk
sc = 128 ** -0.5
t = lambda f: round(cuda_time(f, reps=10)["median_ms"], 3)
print("cached", t(lambda: cached_attention(q4, k4, v4)), flush=True)
out, lse = cached_attention(q4, k4, v4)
lse = lse[0]
for cfg in [dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=4), dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
            dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3), dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
            dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3), dict(BLOCK_M=256, BLOCK_N=64, num_warps=8, num_stages=3),
            dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=4), dict(BLOCK_M=128, BLOCK_N=16, num_warps=8, num_stages=4)]:
    try:
        print("given_lse", cfg, t(lambda: launch.statistics_given_lse(q, k, lse, fsl, 8, kl, sc, config=cfg)), flush=True)
    except Exception as e:
        print("given_lse", cfg, "failed", str(e)[:200])
for cfg in [dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3), dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
            dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3), dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
            dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2), dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=4),
            dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=4), dict(BLOCK_M=64, BLOCK_N=16, num_warps=4, num_stages=4)]:
    try:
        print("tma", cfg, t(lambda: launch.tma_attention(q, k, v, kl, sc, config=cfg)),
              "full", t(lambda: launch.attention_statistics_tma(q, k, v, fsl, 8, kl, sc, config=cfg)), flush=True)
    except Exception as e:
        print("tma", cfg, "failed", str(e)[:200])
print("tma nostats", t(lambda: launch.tma_attention(q, k, v, kl, sc, stats=False)))

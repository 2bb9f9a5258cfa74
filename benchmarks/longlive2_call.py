"""One captured attention call at LongLive 2.0's shape, by route and tile.

The last chunk of a long LongLive 2.0 rollout (Wan2.2-TI2V-5B: 24 heads x 128, 880 tokens a
latent frame; 8 query frames = 7040 queries over the 40 frames of a full cache, the 8-frame
sink plus the 32-frame window = 35200 keys), random bf16, timed with CUDA events (median of
10 after warm-up):

- the model's call (``cached_attention``);
- the ``exact`` route's statistics pass given its log-sum-exp (``statistics_given_lse``,
  ``frame_partials_given_lse_kernel``) at several tiles (the default first);
- the ``fused`` route (``attention_frame_partials_tma_kernel``: ``tma_attention`` alone,
  and with its combine, ``attention_statistics_tma``) at several tiles, and its plain
  flash-attention forward without statistics.

Prints each line and writes JSON to ``--out``:

    PYTHONPATH=src python benchmarks/longlive2_call.py --out $OUT/longlive2_call.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from gpu_benchmark import cuda_time  # noqa: E402

from sinkscope.attention.split import cached_attention  # noqa: E402
from sinkscope.stats import launch  # noqa: E402

HEADS, FRAME_TOKENS, QUERY_FRAMES, KEY_FRAMES = 24, 880, 8, 40
LSE_TILES = [
    (128, 64, 8, 4),
    (128, 64, 8, 3),
    (64, 64, 4, 3),
    (128, 128, 8, 3),
    (64, 128, 4, 3),
    (256, 64, 8, 3),
    (128, 32, 8, 4),
    (128, 16, 8, 4),
]
TMA_TILES = [
    (64, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 128, 8, 3),
    (64, 128, 4, 3),
    (128, 64, 8, 2),
    (64, 32, 4, 4),
    (128, 32, 8, 4),
    (64, 16, 4, 4),
]


def tile(block_m: int, block_n: int, warps: int, stages: int) -> dict:
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    q4, k4, v4 = (
        torch.randn(1, frames * FRAME_TOKENS, HEADS, 128, device="cuda", generator=g).bfloat16()
        for frames in (QUERY_FRAMES, KEY_FRAMES, KEY_FRAMES)
    )
    q, k, v = (x[0].transpose(0, 1) for x in (q4, k4, v4))  # [H, L, D] views, as the capture passes them
    lengths, scale = (FRAME_TOKENS,) * KEY_FRAMES, 128**-0.5

    def ms(fn) -> float:
        return round(cuda_time(fn, reps=10)["median_ms"], 3)

    results: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "heads": HEADS,
        "queries": QUERY_FRAMES * FRAME_TOKENS,
        "keys": KEY_FRAMES * FRAME_TOKENS,
        "rows": [],
    }

    def record(**row) -> None:
        results["rows"].append(row)
        print(json.dumps(row), flush=True)

    record(route="model call", ms=ms(lambda: cached_attention(q4, k4, v4)))
    lse = cached_attention(q4, k4, v4)[1][0]
    for config in (tile(*t) for t in LSE_TILES):
        try:
            record(
                route="exact statistics pass",
                tile=config,
                ms=ms(
                    lambda: launch.statistics_given_lse(
                        q, k, lse, FRAME_TOKENS, QUERY_FRAMES, lengths, scale, config=config
                    )
                ),
            )
        except Exception as error:  # noqa: BLE001 - a tile that does not compile: report it, go on
            record(route="exact statistics pass", tile=config, error=str(error)[:200])
    for config in (tile(*t) for t in TMA_TILES):
        try:
            record(
                route="fused",
                tile=config,
                kernel_ms=ms(lambda: launch.tma_attention(q, k, v, lengths, scale, config=config)),
                ms=ms(
                    lambda: launch.attention_statistics_tma(
                        q, k, v, FRAME_TOKENS, QUERY_FRAMES, lengths, scale, config=config
                    )
                ),
            )
        except Exception as error:  # noqa: BLE001
            record(route="fused", tile=config, error=str(error)[:200])
    record(
        route="fused kernel without statistics",
        ms=ms(lambda: launch.tma_attention(q, k, v, lengths, scale, stats=False)),
    )
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

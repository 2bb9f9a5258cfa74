"""One captured attention call at the last block's shape, against SDPA, in rounds.

The routes of ``capture.attention`` (``fused``: the TMA pass, the key sums and the combine;
``exact``: cuDNN with its log-sum-exp, then ``frame_partials_given_lse_kernel``) at 12
heads x 4680 queries x 32760 keys, bf16. Each round times SDPA and both routes back to back
and keeps their ratios, so that two code trees can be compared in alternating processes on
one GPU (clock drift between processes moved single numbers by up to 10% in one call). Two
timings per route:

- ``alone``: CUDA events around one call (launch latency of the small kernels included);
- ``queued``: 20 calls queued back to back, per call: what a generation sees, where the
  host runs ahead of the GPU.

Only public API (``attention_with_statistics``), so an older tree runs it too:

    PYTHONPATH=src python benchmarks/captured_call.py --label new --out new.json
    PYTHONPATH=old/src python benchmarks/captured_call.py --label old --out old.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_benchmark import cuda_time, last_block_inputs  # noqa: E402

from sinkscope.stats.attention import attention_with_statistics  # noqa: E402


def queued_ms(fn, calls: int = 20, warmup: int = 3) -> float:
    """Milliseconds a call with ``calls`` calls queued back to back (the host ahead of the GPU)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    fsl = 1560
    q4, k4, v4 = last_block_inputs()
    q, k, v = (x[0].transpose(0, 1) for x in (q4, k4, v4))  # [H, L, D] views, as the capture passes them
    layout = dict(frame_seq_length=fsl, query_frames=list(range(18, 21)), key_frames=list(range(21)))
    routes = {
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
            q4.transpose(1, 2), k4.transpose(1, 2), v4.transpose(1, 2)
        ),
        "fused": lambda: attention_with_statistics(q, k, v, fused=True, **layout),
        "exact": lambda: attention_with_statistics(q, k, v, **layout),
    }
    rounds = []
    for _ in range(args.rounds):
        entry = {}
        for name, fn in routes.items():
            entry[f"{name}_alone_ms"] = cuda_time(fn, reps=20)["median_ms"]
            entry[f"{name}_queued_ms"] = queued_ms(fn)
        for name in ("fused", "exact"):
            for timing in ("alone", "queued"):
                entry[f"{name}_{timing}_x_sdpa"] = entry[f"{name}_{timing}_ms"] / entry[f"sdpa_{timing}_ms"]
        rounds.append(entry)
        print(json.dumps({key: round(value, 4) for key, value in entry.items()}), flush=True)
    result = {
        "label": args.label,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rounds": rounds,
        "median": {key: statistics.median(r[key] for r in rounds) for key in rounds[0]},
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({key: round(value, 4) for key, value in result["median"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

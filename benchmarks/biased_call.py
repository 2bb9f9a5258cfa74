"""One edited attention call against the unedited call, at each block of a 21-frame video.

At the 1.3B shape (12 heads x 128, 1560 tokens a frame, 3 query frames) for several key
frame counts, ``edited_attention`` with two edits of key frame 0 (the sink) is timed
beside the unedited call (``cached_attention``, the model's call) with CUDA events (20 calls
queued back to back, per call, median of ``--rounds`` rounds), and checked against a
float64 brute force on its first two heads (the error of the unedited call against the
edited softmax says how far the edit moves the output):

- ``bias_all``: ``logit_bias`` -2.0 (``--bias``) on every head;
- ``mask_two``: ``mask_keys`` on heads 0 and 6 (a ``class:`` selection in this layer).

    PYTHONPATH=src python benchmarks/biased_call.py --out $OUT/biased_call.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from captured_call import queued_ms  # noqa: E402
from gpu_benchmark import last_block_inputs  # noqa: E402

from sinkscope.attention import biased  # noqa: E402
from sinkscope.attention.split import cached_attention  # noqa: E402


def brute_force(q, k, v, frame_bias, key_lengths, heads):
    """float64 output of the first ``heads`` heads: [heads, Lq, D]."""
    bias = biased.token_bias(frame_bias[:heads], key_lengths).double()  # [h, Lk]
    qd, kd, vd = (x[0, :, :heads].double().transpose(0, 1) for x in (q, k, v))
    scores = qd @ kd.transpose(1, 2) * q.shape[-1] ** -0.5 + bias[:, None, :]
    return torch.softmax(scores, dim=-1) @ vd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", default="6,9,12,15,18,21", help="key frame counts")
    parser.add_argument("--bias", type=float, default=-2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    fsl, heads = 1560, 12
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "bias": args.bias, "rows": []}
    for num_k in (int(n) for n in args.frames.split(",")):
        q, k, v = last_block_inputs(heads=heads, num_q=3, num_k=num_k, fsl=fsl)
        key_lengths = (fsl,) * num_k
        bias_all = torch.zeros(heads, num_k, device="cuda")
        bias_all[:, 0] = args.bias
        mask_two = torch.zeros(heads, num_k, device="cuda")
        mask_two[[0, 6], 0] = -math.inf
        methods = {
            "unedited": lambda: cached_attention(q, k, v),
            "bias_all": lambda: biased.edited_attention(q, k, v, bias_all, key_lengths),
            "mask_two": lambda: biased.edited_attention(q, k, v, mask_two, key_lengths),
        }
        biases = {"unedited": bias_all, "bias_all": bias_all, "mask_two": mask_two}
        row = {"key_frames": num_k, "errors": {}}
        for name, fn in methods.items():
            out, _ = fn()
            reference = brute_force(q, k, v, biases[name], key_lengths, 2)
            row["errors"][name] = float((out[0, :, :2].double().transpose(0, 1) - reference).abs().max())
        times: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(args.rounds):
            for name in times:
                times[name].append(queued_ms(methods[name]))
        row["ms"] = {name: statistics.median(t) for name, t in times.items()}
        base = row["ms"].get("unedited")
        row["x_unedited"] = {name: ms / base for name, ms in row["ms"].items()} if base else {}
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

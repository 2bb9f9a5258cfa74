"""What an edited generation costs (issue 35): the unedited 21-frame generation at the
Wan2.1-T2V-1.3B size (random bf16 weights: 30 layers, 12 heads, 1560 tokens a frame, 7
blocks of 3 frames) beside the same generation with each edit, in one process, without
capture and with all 30 layers captured:

- ``logit_bias`` bias 0.0 (the identity: its latents must equal the unedited ones);
- ``mask_keys`` heads [L1H1, L5H10], key_frames [0] (the no-sink variant);
- ``mask_keys`` heads all, key_frames [0];
- ``mask_keys`` two heads in every layer (H1 and H7 of L1-L30), key_frames [0] (what a
  ``class:`` selection spread over the layers costs);
- ``logit_bias`` heads all, key_frames [0], bias -2.0;
- ``quantize_cache`` int8, both; ``quantize_cache`` nvfp4, both.

Every configuration runs once to warm up, then ``--reps`` rounds run every configuration in
turn (so a drift of the machine spreads over all of them), with the GPU memory cache kept
between runs (emptying it made every run pay the allocator again, and varied by up to 25%
between runs). A configuration's overhead is the median over the rounds of its time over
the unedited run's of the same round and capture mode (pairs within a round, so a slow
round moves both); its seconds are the median of its rounds. A configuration's seconds are
the generation's (``GenerationResult.seconds``, synchronized) plus, with capture,
collecting the rows (``capture.to_frame``), as ``gpu_benchmark.py``'s generation section
counts them. Prints a markdown table with the overhead over the unedited run of the same
capture mode and writes JSON to ``--out`` (with each edit's latent distance to the unedited
video by block: 0 in block 0, > 0 after; with random bf16 weights any change of a score,
however small, moves later blocks by about 0.011 (bf16 rounding carried through 30 random
layers), so that is the floor).

    PYTHONPATH=src python benchmarks/interventions.py --out $OUT/interventions.json
    PYTHONPATH=src python benchmarks/interventions.py --edits "every layer,-2.0" --out ...   # a subset
    PYTHONPATH=src python benchmarks/interventions.py --quick --out /tmp/interventions.json   # CPU, tiny shape
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import captured_generation  # noqa: E402

from sinkscope.model import WanConfig, build_model  # noqa: E402
from sinkscope.options import GenerationOptions  # noqa: E402

EDITS = {
    "unedited": [],
    "logit_bias all heads, frame 0, 0.0 (identity)": [
        {"edit": "logit_bias", "heads": "all", "key_frames": [0], "bias": 0.0}
    ],
    "mask_keys [L1H1, L5H10], frame 0": [{"edit": "mask_keys", "heads": ["L1H1", "L5H10"], "key_frames": [0]}],
    "mask_keys all heads, frame 0": [{"edit": "mask_keys", "heads": "all", "key_frames": [0]}],
    # Its heads are filled in for the model's layers (every_layer_heads).
    "mask_keys H1 and H7 of every layer, frame 0": [{"edit": "mask_keys", "key_frames": [0], "heads": []}],
    "logit_bias all heads, frame 0, -2.0": [{"edit": "logit_bias", "heads": "all", "key_frames": [0], "bias": -2.0}],
    "quantize_cache int8 both": [{"edit": "quantize_cache", "format": "int8", "tensors": "both"}],
    "quantize_cache nvfp4 both": [{"edit": "quantize_cache", "format": "nvfp4", "tensors": "both"}],
}
# The ceilings on the overhead, in %.
LIMITS = {"mask_keys": 5.0, "logit_bias": 5.0, "quantize_cache": 15.0}
# --quick: the demo's kind, small enough for a CPU smoke test (head_dim 16, 6 tokens a
# frame); L5H10 exists (6 layers, 12 heads... of 16 channels: dim 192).
QUICK = WanConfig(
    dim=192,
    ffn_dim=64,
    num_heads=12,
    num_layers=6,
    text_dim=16,
    text_len=8,
    freq_dim=16,
    latent_height=4,
    latent_width=6,
)


def build(quick: bool):
    """(model, context, frame_seq_length, num_frames, device)."""
    if quick:
        model = build_model(QUICK, seed=0)
        context = torch.randn(1, 5, QUICK.text_dim, generator=torch.Generator().manual_seed(1))
        return model, context, QUICK.frame_seq_length(), 9, torch.device("cpu")
    from gpu_benchmark import random_context, random_real_model

    return random_real_model(), random_context(), 1560, 21, torch.device("cuda")


def run_once(model, context, options, layers, frame_seq_length) -> tuple[float, float, torch.Tensor]:
    """(generation seconds, collection seconds, latents) of one generation."""
    result, collect, _ = captured_generation(model, context, options, layers, frame_seq_length)
    return result.seconds, collect, result.latents


def block_distances(latents: torch.Tensor, reference: torch.Tensor, block: int = 3) -> list[float]:
    """Per block of latent frames: the L2 distance to the reference over the reference's norm."""
    out = []
    for start in range(0, reference.shape[2], block):
        a, b = latents[:, :, start : start + block].double(), reference[:, :, start : start + block].double()
        out.append(float((a - b).norm() / b.norm()))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "benchmark-out"), "interventions.json"))
    parser.add_argument("--quick", action="store_true", help="a CPU smoke test at a tiny shape")
    parser.add_argument("--reps", type=int, default=5, help="timed rounds (after one warm-up round)")
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile the blocks (jobs do at long rollouts only)"
    )
    parser.add_argument(
        "--edits",
        default="",
        help="only the edits whose names hold one of these comma-separated words (the unedited run always runs)",
    )
    args = parser.parse_args()
    if not args.quick and not torch.cuda.is_available():
        print("needs a CUDA device (or --quick)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model, context, fsl, frames, device = build(args.quick)
    if args.compile:
        model.compile_blocks(dynamic=False)
    all_layers = list(range(model.config.num_layers))
    EDITS["mask_keys H1 and H7 of every layer, frame 0"][0]["heads"] = [
        f"L{layer + 1}H{head}" for layer in all_layers for head in (1, 7)
    ]
    words = [word.strip() for word in args.edits.split(",") if word.strip()]
    chosen = {
        name: spec for name, spec in EDITS.items() if not spec or not words or any(word in name for word in words)
    }
    configs = {
        (name, captured): GenerationOptions.from_config({"num_frames": frames, "interventions": spec})
        for captured in (False, True)
        for name, spec in chosen.items()
    }
    seconds: dict = {key: [] for key in configs}
    collect: dict = {key: [] for key in configs}
    latents: dict = {}
    errors: dict = {}
    for round_ in range(args.reps + 1):
        for key, options in configs.items():
            if key in errors:
                continue
            try:
                generation, collected, video = run_once(model, context, options, all_layers if key[1] else [], fsl)
            except Exception as error:  # noqa: BLE001 - report, keep the others
                errors[key] = f"{type(error).__name__}: {error}\n{traceback.format_exc()[-2000:]}"
                continue
            if round_ == 0:
                latents[key] = video.float()
                continue
            seconds[key].append(generation + collected)
            collect[key].append(collected)
        print(f"round {round_} done", flush=True)
    results = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "quick": args.quick,
        "compiled": args.compile,
        "num_frames": frames,
        "layers": model.config.num_layers,
        "heads": model.config.num_heads,
        "frame_seq_length": fsl,
        "reps": args.reps,
        "rows": [],
    }
    lines = [
        "| edit | capture | s (median) | min-max | overhead | limit | latent distance by block |",
        "|---|---|---|---|---|---|---|",
    ]
    for (name, captured), times in seconds.items():
        key = (name, captured)
        row = {"edit": name, "interventions": EDITS[name], "capture": "all layers" if captured else "none"}
        if key in errors:
            row["error"] = errors[key]
            lines.append(f"| {name} | {row['capture']} | error: {errors[key].splitlines()[0]} | | | | |")
            results["rows"].append(row)
            continue
        base = seconds.get(("unedited", captured))
        median = statistics.median(times)
        row.update(seconds_median=median, seconds=times, collect_seconds_median=statistics.median(collect[key]))
        overhead = None
        if base and len(base) == len(times) and name != "unedited":
            ratios = [t / b for t, b in zip(times, base)]
            row["paired_ratios"] = ratios
            overhead = 100 * (statistics.median(ratios) - 1)
        limit = LIMITS.get(EDITS[name][0]["edit"]) if EDITS[name] and "identity" not in name else None
        reference = latents.get(("unedited", captured))
        distances = block_distances(latents[key], reference) if reference is not None else []
        row["latents_equal_unedited"] = reference is not None and torch.equal(latents[key], reference)
        row.update(
            overhead_pct=overhead,
            limit_pct=limit,
            latent_distance_by_block=distances,
            within_limit=None if overhead is None or limit is None else overhead <= limit,
        )
        results["rows"].append(row)
        lines.append(
            f"| {name} | {row['capture']} | {median:.3f} | {min(times):.3f}-{max(times):.3f} | "
            f"{'' if overhead is None else f'{overhead:+.1f}%'} | {'' if limit is None else f'{limit:.0f}%'} | "
            f"{' '.join(f'{d:.2g}' for d in distances)} |"
        )
    table = "\n".join(lines)
    results["table"] = table
    out.write_text(json.dumps(results, indent=1))
    print(
        f"\n{results['device']}, {frames} frames, {results['layers']} layers x {results['heads']} heads, "
        f"{fsl} tokens a frame, median of {args.reps}:\n\n{table}"
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""Token-profile storage: bytes of a 30-layer video, float16-precision rounding, writer throughput.

Sections (``--sections``, comma-separated; default all):

- ``rounding``: the token profiles of one generation (``--model``, last block, the
  captured layers) encoded (float16 precision relative to each frame's exact float32 mean / mass)
  and decoded: per-token error against the float32 values the capture computed, and the
  identities (decoded logits average to frame_logit_mean, probabilities sum to
  frame_prob_mass; and both against frame_attention's query-averaged values).
- ``bytes``: one generation with ``--layers`` captured written by the extraction writer:
  bytes per file kind, scaled to 30 layers; the same token values in the float32 layout
  before (for comparison); and an estimate of a real-size 30-layer video (Wan2.1-T2V-1.3B,
  21 frames, 1560 tokens a frame) from the layout: rows x bytes a value after compression,
  measured on synthetic real-shape values and on this run's values.
- ``writer``: the extraction writer fed synthetic records of ``--model``'s last-block
  shape: records a second and MB/s of token values inline and with 1, 2, 4 threads, the
  producer's time per record (what the generation pays: ``handoff``) against the
  writers' busy time.

``--model tiny`` (the demo config: 6 layers, 24 tokens a frame, 9 frames) runs on a CPU in
seconds; ``--model wan2.1-t2v-1.3b`` builds the real shapes with random weights (bf16 on
CUDA). Prints JSON, and writes ``token_storage.json`` to ``--out`` when given.

    PYTHONPATH=src python benchmarks/token_storage.py --model tiny --sections rounding,bytes,writer
    PYTHONPATH=src python benchmarks/token_storage.py --model wan2.1-t2v-1.3b --out $OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from sinkscope.generation.capture import CallRecord, FrameStatsCapture  # noqa: E402
from sinkscope.generation.common import CallInfo  # noqa: E402
from sinkscope.generation.sampler import generate  # noqa: E402
from sinkscope.model import WanModel, build_model, get_model_config, init_random_weights  # noqa: E402
from sinkscope.model.layout import AttentionLayout  # noqa: E402
from sinkscope.options import GenerationOptions  # noqa: E402
from sinkscope.pipeline.writing import ExtractionWriter  # noqa: E402
from sinkscope.stats.reference import CallStatistics  # noqa: E402
from sinkscope.tables import TOKEN_PROFILES_SCHEMA_V1, read_table, write_table  # noqa: E402
from sinkscope.tokens import decode_token_profiles, decode_token_values, encode_token_values, token_values  # noqa: E402

MB = 1e6
RUN = {"checkpoint": "bench", "variant": "default", "prompt_id": "p", "seed": 0}
# Wan2.1-T2V-1.3B's video: 30 layers, 12 heads, 21 latent frames in 7 blocks of 3, 4 steps
# and the cache pass a block, 1560 tokens a frame.
REAL = {"layers": 30, "heads": 12, "frames": 21, "block": 3, "calls": 5, "tokens": 1560}


def model_for(name: str, device: str) -> tuple[WanModel, int, int]:
    """The model, its tokens a frame, and the latent frames of a video."""
    if name in ("tiny", "demo"):
        model = build_model("demo", seed=0, device=device)
        return model, model.config.frame_seq_length(), 9
    config = get_model_config(name)
    with torch.device("meta"):
        model = WanModel(config)
    model = model.to_empty(device=device)
    init_random_weights(model, seed=0, device=device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return model.to(dtype).eval().requires_grad_(False), config.frame_seq_length(), 21


def context(model: WanModel, device: str) -> torch.Tensor:
    return torch.randn(1, 24, model.config.text_dim, generator=torch.Generator().manual_seed(1)).to(device, model.dtype)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def section_rounding(model, fsl, frames, device, layers) -> dict:
    capture = FrameStatsCapture(model, layers, frame_seq_length=fsl, token_profiles="last_block")
    with capture:
        generate(
            model, context(model, device), options=GenerationOptions(num_frames=frames), seed=0, observers=[capture]
        )
    host = capture._host()  # the float32 values the capture computed, before any encoding
    prob_err, logit_err, mean_res, mass_res, vs_frames = [], [], [], [], []
    tables = capture.layer_tables()
    for record, arrays in zip(capture.records, host):
        if "token_prob_mean" not in arrays:
            continue
        lengths = np.asarray(record.layout.key_lengths)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        for name in ("token_logit_mean", "token_prob_mean"):
            assert arrays[name].shape[1] == lengths.sum()
        for _f, (start, n) in enumerate(zip(starts, lengths)):
            logit = arrays["token_logit_mean"][:, start : start + n].astype(np.float32)
            prob = arrays["token_prob_mean"][:, start : start + n].astype(np.float32)
            stored = encode_token_values(logit, prob)
            dl, dp = decode_token_values(
                stored["frame_logit_mean"],
                stored["frame_prob_mass"],
                stored["token_logit_centered"],
                stored["token_prob_ratio"],
            )
            positive = prob > 0
            prob_err.append(np.abs(dp - prob)[positive] / prob[positive])
            spread = np.abs(logit - logit.mean(axis=1, keepdims=True)).max(axis=1, keepdims=True)
            logit_err.append((np.abs(dl - logit) / np.maximum(spread, 1e-30)).ravel())
            mean_res.append(
                np.abs(dl.astype(np.float64).mean(1) - stored["frame_logit_mean"])
                / np.maximum(np.abs(dl).max(1), 1e-30)
            )
            mass_res.append(
                np.abs(dp.astype(np.float64).sum(1) - stored["frame_prob_mass"]) / stored["frame_prob_mass"]
            )
    for layer in layers:
        frames_ = tables[layer]["frames"]
        tokens = tables[layer]["tokens"]
        keys = ["block", "pass", "step", "head", "key_frame"]
        per_frame = frames_.groupby(keys, observed=True)[["logit_mean", "prob_mass"]].mean()
        stored = tokens.set_index(keys)[["frame_logit_mean", "frame_prob_mass"]]
        joined = stored.join(per_frame, how="inner")
        vs_frames.append(np.abs(joined["frame_logit_mean"] - joined["logit_mean"]).max())
        vs_frames.append(np.abs(joined["frame_prob_mass"] - joined["prob_mass"]).max())
    prob_err, logit_err = np.concatenate(prob_err), np.concatenate(logit_err)
    return {
        "token_values": int(prob_err.size),
        "prob_relative_error": {
            "median": float(np.median(prob_err)),
            "p99": float(np.quantile(prob_err, 0.99)),
            "max": float(prob_err.max()),
        },
        "logit_error_over_frame_spread": {"median": float(np.median(logit_err)), "max": float(logit_err.max())},
        "identity_logit_mean_residual_relative_max": float(np.concatenate(mean_res).max()),
        "identity_prob_mass_residual_relative_max": float(np.concatenate(mass_res).max()),
        "frame_values_vs_frame_attention_max_abs": float(max(vs_frames)),
        "half_ulp_of_11_bits": 2**-11,
    }


def _folder_bytes(folder: Path) -> dict[str, int]:
    kinds = {"frames": 0, "queries": 0, "tokens": 0}
    for path in folder.glob("*.parquet"):
        kind = "tokens" if path.name.endswith(".tokens.parquet") else "queries" if ".queries" in path.name else "frames"
        kinds[kind] += path.stat().st_size
    return kinds


def _synthetic_tokens(rows: int, tokens: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token logit and probability means of a real-shape frame: a smooth field over the
    patch grid plus noise, a few sink-like tokens; probabilities a softmax of the logits."""
    rng = np.random.default_rng(seed)
    side = int(np.sqrt(tokens * 52 / 30)) or 1  # Wan: 30 x 52 patches
    grid = np.arange(tokens)
    y, x = grid // side, grid % side
    logit = np.empty((rows, tokens), np.float32)
    for r in range(rows):
        field = np.sin(x / rng.uniform(3, 12) + rng.uniform(0, 6)) * np.cos(y / rng.uniform(3, 12))
        values = rng.normal(0, 1) + rng.uniform(0.2, 2) * field + rng.normal(0, 0.3, tokens)
        values[rng.integers(0, tokens, 3)] += rng.uniform(2, 6)
        logit[r] = values
    weight = np.exp(logit - logit.max(1, keepdims=True))
    prob = (weight / weight.sum(1, keepdims=True) * rng.uniform(0.01, 0.5, (rows, 1))).astype(np.float32)
    return logit, prob


def _token_bytes_per_value(logit: np.ndarray, prob: np.ndarray, tmp: Path) -> dict[str, float]:
    """Compressed bytes a token value in the compact (float16-precision) and the old float32 layout."""
    import pandas as pd

    from sinkscope.tables import TOKEN_PROFILES_SCHEMA

    rows = len(logit)
    base = pd.DataFrame(
        {
            **{k: [v] * rows for k, v in RUN.items()},
            "layer": 0,
            "head": np.arange(rows) % 12,
            "block": 6,
            "pass": "denoise",
            "step": 0,
            "timestep": 0.0,
            "prompt_segment": 0,
            "key_frame": np.arange(rows) // 12 % 21,
            "key_tokens": logit.shape[1],
            "key_position_shift": 0,
        }
    )
    stored = encode_token_values(logit, prob)
    new = base.assign(**{name: list(v) if v.ndim == 2 else v for name, v in stored.items()})
    old = base.assign(token_logit_mean=list(logit), token_prob_mean=list(prob))
    out = {}
    for label, frame, schema in (("compact", new, TOKEN_PROFILES_SCHEMA), ("float32", old, TOKEN_PROFILES_SCHEMA_V1)):
        path = tmp / f"{label}.parquet"
        write_table(frame, path, schema, {})
        out[label] = path.stat().st_size / (2 * logit.size)
    return out


def section_bytes(model, fsl, frames, device, layers) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder = tmp / "extract"
        folder.mkdir()
        workers = 0 if device != "cuda" else min(4, len(layers))
        writer = ExtractionWriter(folder, layers, frame_seq_length=fsl, run_columns=RUN, workers=workers)
        capture = FrameStatsCapture(
            model, layers, frame_seq_length=fsl, token_profiles="last_block", handoff=writer.submit
        )
        sync(device)
        began = time.perf_counter()
        with capture:
            result = generate(
                model, context(model, device), options=GenerationOptions(num_frames=frames), seed=0, observers=[capture]
            )
        generated = time.perf_counter()
        written, counts = writer.finish({"package_version": "bench"})
        finished = time.perf_counter()
        kinds = _folder_bytes(folder)
        # The same token values in the float32 layout of before.
        old = tmp / "old"
        old.mkdir()
        values = 0
        for name in written:
            if name.endswith(".tokens.parquet"):
                table = read_table(folder / name)
                values += 2 * int(table["key_tokens"].sum())
                write_table(
                    decode_token_profiles(table), old / name, TOKEN_PROFILES_SCHEMA_V1, {}, row_groups_by="block"
                )
        old_tokens = sum(p.stat().st_size for p in old.glob("*.parquet"))
        scale = REAL["layers"] / len(layers)
        measured = {
            "layers": len(layers),
            "frames": frames,
            "tokens_a_frame": fsl,
            "token_values": values,
            "bytes": kinds,
            "bytes_total": sum(kinds.values()),
            "bytes_30_layers": {k: v * scale for k, v in kinds.items()},
            "MB_30_layers": sum(kinds.values()) * scale / MB,
            "token_MB_30_layers_float32_layout": old_tokens * scale / MB,
            "token_MB_30_layers_compact_layout": kinds["tokens"] * scale / MB,
            "generation_seconds": generated - began,
            "result_seconds": result.seconds,
            "finish_seconds": finished - generated,
            **writer.timings,
            "drain_seconds": writer.drain_seconds,
        }
        # This run's token values, bytes a value in either layout (the file's metadata included).
        table = read_table(folder / [n for n in written if n.endswith(".tokens.parquet")][-1])
        logit, prob = token_values(table)
        per_value_run = _token_bytes_per_value(logit, prob, tmp)
        # Real shape, synthetic values: 1 layer's last block = 5 calls x 12 heads x 21 frames rows.
        rows = REAL["calls"] * REAL["heads"] * REAL["frames"]
        logit, prob = _synthetic_tokens(rows, REAL["tokens"])
        per_value_real = _token_bytes_per_value(logit, prob, tmp)
    real_values = 2 * REAL["layers"] * rows * REAL["tokens"]
    # Frame and query rows of a real video, at the bytes a row this run's files took.
    blocks = REAL["frames"] // REAL["block"]
    frame_rows = (
        REAL["layers"]
        * REAL["calls"]
        * REAL["heads"]
        * REAL["block"]
        * sum(REAL["block"] * (b + 1) for b in range(blocks))
    )
    query_rows = REAL["layers"] * REAL["calls"] * blocks * REAL["heads"] * REAL["block"]
    frame_row_bytes = kinds["frames"] / max(counts_sum(counts, ""), 1)
    query_row_bytes = kinds["queries"] / max(counts_sum(counts, ".queries"), 1)
    estimate = {
        "token_values": real_values,
        "frame_rows": frame_rows,
        "query_rows": query_rows,
        "bytes_a_token_value": per_value_real,
        "bytes_a_frame_row": frame_row_bytes,
        "bytes_a_query_row": query_row_bytes,
        "MB_compact_layout": (
            real_values * per_value_real["compact"] + frame_rows * frame_row_bytes + query_rows * query_row_bytes
        )
        / MB,
        "MB_float32_layout": (
            real_values * per_value_real["float32"] + frame_rows * frame_row_bytes + query_rows * query_row_bytes
        )
        / MB,
        "MB_compact_layout_at_this_runs_bytes_a_value": (
            real_values * per_value_run["compact"] + frame_rows * frame_row_bytes + query_rows * query_row_bytes
        )
        / MB,
        "target_MB": 200,
    }
    return {"measured": measured, "bytes_a_token_value_this_run": per_value_run, "real_size_estimate": estimate}


def counts_sum(counts: dict[str, int], suffix: str) -> int:
    """Rows of the files of one kind: suffix "" (layer<L>.parquet), ".queries" or ".tokens"."""
    return sum(
        n for name, n in counts.items() if name.removesuffix(".parquet").partition(".")[1:] == (suffix[:1], suffix[1:])
    )


def _records(fsl: int, heads: int, frames: int, calls: int, layers: int, device: str) -> list[CallRecord]:
    """Synthetic last-block records: ``calls`` calls x ``layers`` layers, every key frame whole."""
    keys = frames * fsl
    layout = AttentionLayout(
        query_frames=tuple(range(frames - 3, frames)),
        key_frames=tuple(range(frames)),
        key_lengths=(fsl,) * frames,
        key_position_shift=(0,) * frames,
    )
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(heads, keys, device=device, generator=g)
    probs = torch.softmax(logits, dim=-1)
    stats = CallStatistics(
        logit_mean=torch.randn(heads, 3, frames, device=device, generator=g),
        prob_mass=torch.full((heads, 3, frames), 1 / frames, device=device),
        argmax_share=torch.full((heads, 3, frames), 1 / frames, device=device),
        entropy=torch.rand(heads, 3, device=device, generator=g),
        token_logit_mean=logits,
        token_prob_mean=probs,
    )
    records = []
    for step in range(calls):
        info = CallInfo(
            block=frames // 3 - 1,
            pass_="denoise" if step < calls - 1 else "cache",
            step=step,
            timestep=1000.0 - step,
            start_frame=frames - 3,
            num_frames=3,
            is_last_block=True,
        )
        records += [CallRecord(layer, info, layout, stats) for layer in range(layers)]
    return records


def section_writer(fsl, frames, device, heads: int = 12, layers: int = 30) -> dict:
    records = _records(fsl, heads, frames, 5, layers, device)
    values = sum(2 * heads * frames * fsl for _ in records)
    out = {"records": len(records), "token_values": values, "device": device}
    for workers in (0, 1, 2, 4):
        with tempfile.TemporaryDirectory() as tmp:
            writer = ExtractionWriter(tmp, range(layers), frame_seq_length=fsl, run_columns=RUN, workers=workers)
            sync(device)
            began = time.perf_counter()
            for record in records:
                writer.submit(record)
            submitted = time.perf_counter()
            writer.finish({"package_version": "bench"})
            done = time.perf_counter()
            out[f"workers_{workers}"] = {
                "seconds": done - began,
                "records_per_s": len(records) / (done - began),
                "token_MB_per_s": values * 4 / MB / (done - began),  # float32 values consumed
                "handoff_ms_per_record": 1e3 * writer.handoff_seconds / len(records),
                "submit_seconds": submitted - began,
                "writer_busy_seconds": writer.queue.busy_seconds,
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default="tiny", help="tiny (the demo config) or a model config name (wan2.1-t2v-1.3b)"
    )
    parser.add_argument("--sections", default="rounding,bytes,writer")
    parser.add_argument(
        "--layers",
        default=None,
        help="captured layers, e.g. 0-29 or 0,4 (default: every layer); "
        "the writer section writes as many synthetic layers",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sections = args.sections.split(",")
    if set(sections) <= {"writer"}:  # synthetic records: the shapes, no model
        config = get_model_config("demo" if args.model == "tiny" else args.model)
        model, fsl, frames = None, config.frame_seq_length(), 9 if args.model in ("tiny", "demo") else 21
    else:
        model, fsl, frames = model_for(args.model, args.device)
        config = model.config
    num_layers = config.num_layers
    if args.layers is None:
        layers = list(range(num_layers))
    elif "-" in args.layers:
        lo, hi = map(int, args.layers.split("-"))
        layers = list(range(lo, hi + 1))
    else:
        layers = [int(x) for x in args.layers.split(",")]
    results: dict = {
        "model": args.model,
        "device": args.device,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
    }
    for section in sections:
        began = time.perf_counter()
        try:
            if section == "rounding":
                results[section] = section_rounding(model, fsl, frames, args.device, layers[:2])
            elif section == "bytes":
                results[section] = section_bytes(model, fsl, frames, args.device, layers)
            elif section == "writer":
                results[section] = section_writer(fsl, frames, args.device, config.num_heads, len(layers))
            else:
                raise SystemExit(f"unknown section {section!r}; use rounding, bytes, writer")
        except SystemExit:
            raise
        except Exception:  # noqa: BLE001 - report, keep going
            results[section] = {"error": traceback.format_exc()[-3000:]}
        print(f"# {section}: {time.perf_counter() - began:.1f} s", file=sys.stderr)
        print(json.dumps({section: results[section]}, indent=1, default=float), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "token_storage.json").write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

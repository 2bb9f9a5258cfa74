"""Train the demo and measure its first-frame sink (docs/trained-demo.md, "Toward a first-frame sink").

One command per GPU call: ``flow`` trains (``train_demo``) and probes every saved
checkpoint, ``ode`` distils a teacher, ``probe`` only measures checkpoints, ``evaluate``
runs ``evaluate_demo``. Small bf16 copies of the checkpoints and a JSON record go to
``--out`` (the device's $OUT).

The probe is what the default config measures: the real KV-cache sampler, 21 frames,
``FrameStatsCapture`` on every layer, ``head_diagnostics`` of the last block at the last
denoising step; a head is ``sink`` when its frame-0 mass is >= 0.3 (uniform 0.048). It
runs the default prompt (circle, seed 0) and two more (bounce, drift), whose periods
do not put frame 0 in phase with the last block, so that a frame-0 peak there is no
periodic attention.

    PYTHONPATH=src python benchmarks/sink_demo.py flow --out /tmp/sink --steps 3000 ...
    PYTHONPATH=src python benchmarks/sink_demo.py probe runs/x/final.pt
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from sinkscope.demo import data as synthetic
from sinkscope.demo.saving import export_checkpoint
from sinkscope.demo.train import TrainConfig, train_demo
from sinkscope.io import atomic_path

PROBE_PROMPTS = ("circle", "bounce", "drift")
FIGURE_HEADS = ((0, 0), (4, 9))  # config.yaml figures.heads: L1H1, L5H10 (0-based)
UNIFORM = 1 / synthetic.FRAMES
# The device tool returns files of at most 16 MiB: a training state (about 53 MB for the
# demo) comes back in parts of this size, and --resume joins them.
PART_BYTES = 15 << 20


def split_into_parts(path: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """Cut ``path`` into ``path.part0``, ``path.part1``, ... of at most ``part_bytes``; remove it."""
    parts = []
    with open(path, "rb") as source:
        while chunk := source.read(part_bytes):
            parts.append(path.with_name(f"{path.name}.part{len(parts)}"))
            parts[-1].write_bytes(chunk)
    path.unlink()
    return parts


def joined_state(path: str) -> str:
    """``path``; where only its parts exist (``path.part0``, ...), joined into ``path`` first."""
    whole = Path(path)
    if whole.exists() or not whole.with_name(whole.name + ".part0").exists():
        return path
    with atomic_path(whole) as joined, open(joined, "wb") as out:
        index = 0
        while (part := whole.with_name(f"{whole.name}.part{index}")).exists():
            out.write(part.read_bytes())
            index += 1
    return path


def probe(path: str | Path, *, device: str = "cuda", prompts=PROBE_PROMPTS, seed: int = 0) -> dict:
    """Frame-0 mass per head (last block, last step) and head classes, per prompt."""
    from sinkscope.generation.capture import FrameStatsCapture
    from sinkscope.generation.sampler import generate
    from sinkscope.model import load_transformer
    from sinkscope.model.text import demo_embedding
    from sinkscope.options import GenerationOptions
    from sinkscope.stats.summaries import head_diagnostics

    model = load_transformer(str(path), format="self_forcing", model="demo", device=device)
    config = model.config
    out: dict = {"checkpoint": str(path), "prompts": {}}
    for name in prompts:
        context = demo_embedding(synthetic.CLASS_PROMPTS[name], config.text_dim, config.text_len)[None]
        capture = FrameStatsCapture(
            model,
            range(config.num_layers),
            frame_seq_length=config.frame_seq_length(),
            token_profiles="none",
            backend="torch",
        )
        with capture:
            generate(model, context, options=GenerationOptions(), seed=seed, observers=[capture])
        frame = capture.to_frame().assign(checkpoint="demo", variant="default", prompt_id=name, seed=seed)
        diagnostics = head_diagnostics(frame)
        denoise = diagnostics[diagnostics["pass"] == "denoise"]
        last = denoise[denoise["step"] == denoise["step"].max()]
        last = last.sort_values(["layer", "head"])
        mass = last["frame0_mass"].to_numpy().reshape(config.num_layers, config.num_heads)
        classes = last["head_class"].to_numpy().reshape(config.num_layers, config.num_heads)
        out["prompts"][name] = {
            "frame0_mass": [[round(float(v), 4) for v in row] for row in mass],
            "head_class": [list(map(str, row)) for row in classes],
            "sink_heads": int((classes == "sink").sum()),
            "sink_share": float((classes == "sink").mean()),
            "class_counts": {c: int((classes == c).sum()) for c in ("sink", "local", "periodic", "diffuse")},
            "figure_heads_frame0": {
                f"L{layer + 1}H{head + 1}": round(float(mass[layer, head]), 4) for layer, head in FIGURE_HEADS
            },
            "layer_frame0": [round(float(v), 4) for v in mass.mean(1)],
        }
    return out


def summary_line(result: dict) -> str:
    cells = []
    for name, entry in result["prompts"].items():
        figure = " ".join(f"{k} {v / UNIFORM:.1f}x" for k, v in entry["figure_heads_frame0"].items())
        cells.append(
            f"{name}: sink {entry['sink_heads']}/72, max {max(max(r) for r in entry['frame0_mass']):.2f}, {figure}"
        )
    return f"{Path(result['checkpoint']).name}: " + "; ".join(cells)


def _export_all(result, out: Path, keep_steps: set[int]) -> list[str]:
    kept = []
    for path in result.checkpoints:
        step = int(path.stem.split("_")[1])
        if step in keep_steps:
            dest = out / f"step_{step:06d}.pt"
            export_checkpoint(path, dest, dtype="bfloat16")
            kept.append(str(dest))
    return kept


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("flow", "ode"):
        p = sub.add_parser(name)
        p.add_argument("--out", required=True)
        p.add_argument("--name", default=name)
        p.add_argument("--steps", type=int, default=3000)
        p.add_argument("--batch-size", type=int, default=256)
        p.add_argument("--lr", type=float, default=2e-3)
        p.add_argument("--warmup", type=int, default=100)
        p.add_argument("--ema", type=float, default=0.999)
        p.add_argument("--save-every", type=int, default=250)
        p.add_argument("--keep-steps", default="", help="comma-separated steps whose bf16 copies go to --out")
        p.add_argument("--max-seconds", type=float, default=None)
        p.add_argument("--stop-at", type=int, default=None, help="stop after this step; NAME_state.pt goes to --out")
        p.add_argument(
            "--resume",
            default=None,
            help="a NAME_state.pt of the same run to go on from (or the stem of its .partN files)",
        )
        p.add_argument("--first-frame", default="image")
        p.add_argument("--temporal-compression", type=int, default=4)
        p.add_argument("--grain", type=float, default=0.0)
        p.add_argument("--data-extra", default="", help="k=v,... more synthetic_batch options")
        p.add_argument("--mode", default="teacher_forcing")
        p.add_argument("--weight-decay", type=float, default=0.01)
        p.add_argument("--schedule", default="cosine")
        p.add_argument("--cond-dropout", type=float, default=0.0, help="share of videos trained with the empty prompt")
        p.add_argument(
            "--guidance", type=float, default=1.0, help="ode: classifier-free guidance of the teacher's pool"
        )
        p.add_argument("--eval-ode-guidance", type=float, default=1.0)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--teacher")
        p.add_argument(
            "--init-from", default=None, help="flow: start from this checkpoint (e.g. a --mode bidirectional run)"
        )
        p.add_argument("--pool-size", type=int, default=16384)
        p.add_argument("--ode-chunk", type=int, default=1024)
        p.add_argument("--probe-prompts", default=",".join(PROBE_PROMPTS))
        p.add_argument("--evaluate", action="store_true")
        p.add_argument("--eval-ode-steps", type=int, default=None)
        p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p = sub.add_parser("probe")
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--out", default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p = sub.add_parser("evaluate")
    p.add_argument("checkpoint")
    p.add_argument("--out", required=True)
    p.add_argument("--ode-steps", type=int, default=None)
    p.add_argument("--ode-guidance", type=float, default=1.0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    if args.command == "probe":
        results = [probe(c, device=args.device) for c in args.checkpoints]
        for r in results:
            print(summary_line(r), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
        return 0
    if args.command == "evaluate":
        from sinkscope.demo.evaluation import (
            evaluate_demo,
            format_attention,
            format_evaluation,
        )

        result = evaluate_demo(
            args.checkpoint, device=args.device, ode_steps=args.ode_steps, ode_guidance=args.ode_guidance
        )
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(format_evaluation(result))
        print(format_attention(result))
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp") / f"sink_demo_{args.name}"
    shutil.rmtree(work, ignore_errors=True)
    config = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        seed=args.seed,
        device=args.device,
        lr=args.lr,
        ema=args.ema,
        warmup=args.warmup,
        save_every=args.save_every,
        weight_decay=args.weight_decay,
        schedule=args.schedule,
        cond_dropout=args.cond_dropout,
        guidance=args.guidance,
        compile=args.device.startswith("cuda"),
        log_every=min(100, args.steps),
        max_seconds=args.max_seconds,
        first_frame=args.first_frame,
        temporal_compression=args.temporal_compression,
        grain=args.grain,
        data_extra={k: float(v) for k, v in (i.split("=") for i in args.data_extra.split(",") if i)},
        mode=args.mode,
        stage=args.command,
        teacher=args.teacher,
        pool_size=args.pool_size,
        ode_chunk=args.ode_chunk,
        progress=False,
        stop_at=args.stop_at,
        resume=joined_state(args.resume) if args.resume else None,
        init_from=args.init_from,
    )
    began = time.perf_counter()
    result = train_demo(work, config)
    print(f"{args.name}: {result.steps} steps in {result.seconds:.0f} s, loss {result.final_loss:.4f}", flush=True)
    final = out / f"{args.name}_final.pt"
    shutil.copy(result.final_checkpoint, final)
    if result.metadata.get("state"):  # stopped early: what --resume goes on from
        state = out / f"{args.name}_state.pt"
        shutil.copy(result.metadata["state"], state)
        parts = split_into_parts(state) if state.stat().st_size > PART_BYTES else [state]
        print(
            f"{args.name}: stopped at step {result.steps}; {len(parts)} file(s) {parts[0].name}..; go on with "
            f"--resume {state}",
            flush=True,
        )
    keep = {int(s) for s in args.keep_steps.split(",") if s}
    kept = _export_all(result, out, keep) if keep else []
    for path in kept:
        Path(path).rename(out / f"{args.name}_{Path(path).name}")
    kept = [str(out / f"{args.name}_{Path(p).name}") for p in kept]
    prompts = tuple(p for p in args.probe_prompts.split(",") if p)
    probes = []
    print(result.loss_log.read_text(), flush=True)
    for path in [*[str(p) for p in result.checkpoints], str(result.final_checkpoint)]:
        r = probe(path, prompts=prompts, device=args.device)
        print(summary_line(r), flush=True)
        probes.append(r)
    record = {
        "name": args.name,
        "argv": sys.argv,
        "steps": result.steps,
        "seconds": result.seconds,
        "final_loss": result.final_loss,
        "loss_log": result.loss_log.read_text(),
        "train": result.metadata,
        "probes": probes,
        "kept": kept,
        "wall": time.perf_counter() - began,
    }
    (out / f"{args.name}.json").write_text(json.dumps(record, indent=1))
    if args.evaluate:
        from sinkscope.demo.evaluation import (
            evaluate_demo,
            format_attention,
            format_evaluation,
        )

        evaluation = evaluate_demo(
            final, device=args.device, ode_steps=args.eval_ode_steps, ode_guidance=args.eval_ode_guidance
        )
        record["evaluation"] = evaluation
        print(format_evaluation(evaluation))
        print(format_attention(evaluation), flush=True)
    (out / f"{args.name}.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

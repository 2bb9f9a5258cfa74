"""What a head atlas costs on a GPU at the Wan2.1-T2V-1.3B shape (random bf16 weights read
from a Wan release folder), and the whole 360-head atlas of one seed extrapolated.

The cost of an atlas is its runs x (a generation + what each run adds). This measures, in
one process call of a few minutes, time-boxed (``--budget``):

1. ``bare``: one bare generation (21 latent frames, Self-Forcing's 4 steps and cache pass,
   nothing captured), eager and compiled, the median of ``--reps`` after a warm-up: what a
   run cannot cost less than.
2. ``job``: one extraction job of ``--runs`` runs in a fresh process, as the workflow runs
   it (``sinkscope.pipeline.extract.extract_runs_job``: the model loaded, and compiled,
   once; each run's folder, manifest and integrity): the untouched run (30 layers
   captured), single-head sink masks (each capturing its head's layer: the sweep
   ``sink_per_head``), one frame mask (every head, 30 layers: ``cache_per_frame``) and one
   sink mask of 180 heads (30 layers: a ``prune_sink`` run), eager then compiled
   (``capture.compile: auto`` compiles a job of 24 runs: 504 frames). Each run's wall time
   (generation, capture, latents, files) and the job's start-up, import and load.
3. the per-run cost over a bare generation (goal: at most 1.15x, loading and compiling
   amortised away), and the atlas of ``configs/head-atlas-1.3b.yaml`` for one seed
   extrapolated from them: 360 head runs, 18 frame runs, 25 pruning runs and the untouched
   run in jobs of up to 64 runs (goal: the 360 head runs under 15 minutes).

Rows go to ``$OUT/atlas_scale.jsonl`` as they are measured (a cut-short call keeps them),
the summary to ``$OUT/atlas_scale.json`` and ``atlas_scale.md``. On the device machine:

    PYTHONPATH=src python benchmarks/atlas_scale.py --out $OUT

``--smoke`` runs the same on the CPU at the demo's size (no release folder: its seeded
weights), to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

# One seed of configs/head-atlas-1.3b.yaml: the sweeps' runs beside the untouched one.
ATLAS = {"head": 360, "frame": 18, "prune": 25, "default": 1}
RUNS_PER_JOB = 64  # runs_per_job: auto (sinkscope.pipeline.machinecheck.AUTO_RUNS_PER_JOB)

JOB_DRIVER = """
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {src!r})
import sinkscope.pipeline.extract as extract
t1 = time.perf_counter()
walls, loads = [], []
real_generate, real_load = extract._generate, extract._load_model

def generate(*args, **kwargs):
    began = time.perf_counter()
    out = real_generate(*args, **kwargs)
    walls.append(time.perf_counter() - began)
    return out

def load(*args, **kwargs):
    began = time.perf_counter()
    out = real_load(*args, **kwargs)
    loads.append(time.perf_counter() - began)
    return out

extract._generate, extract._load_model = generate, load
made = extract.extract_runs_job(job={job!r}, prompt_id="p", seed=0, outputs={outputs!r}, embedding={embedding!r},
                                weights_sha256="benchmark", staging={staging!r}, code="benchmark")
t2 = time.perf_counter()
print("RESULT " + json.dumps({{"import_seconds": t1 - t0, "job_seconds": t2 - t1, "load_seconds": loads[0],
                              "run_walls": walls, "timings": [run["timings"] for run in made]}}))
"""


class Rows:
    """Each measured row appended to $OUT/atlas_scale.jsonl and printed as it comes."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.summary: dict = {}
        out.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, row: dict) -> None:
        self.summary[name] = row
        with open(self.out / "atlas_scale.jsonl", "a") as handle:
            handle.write(json.dumps({"row": name, **row}, default=str) + "\n")
        print(f"[{name}] {json.dumps(row, default=str)}", flush=True)
        (self.out / "atlas_scale.json").write_text(json.dumps(self.summary, indent=1, default=str))


def head_labels(count: int, num_layers: int, num_heads: int) -> list[str]:
    """``count`` heads spread over the layers (each layer in turn, a head further each time)."""
    heads = [(index % num_layers, (index // num_layers * 5 + index) % num_heads) for index in range(count)]
    return [f"L{layer + 1}H{head + 1}" for layer, head in dict.fromkeys(heads)]


def job_params(checkpoint: dict, device: str, dtype: str, runs: int, num_layers: int, num_heads: int, compile_):
    """A job of ``runs`` runs as ``ExtractionPlan.job_params`` gives it: the untouched run,
    single-head sink masks, one frame mask and one 180-head sink mask (the last two, and the
    untouched run, capture every layer)."""
    from sinkscope.options import GenerationOptions

    every = list(range(num_layers))
    capture = {"backend": "auto", "attention": "exact", "kernels": "fast", "compile": compile_}
    atlas_capture = {**capture, "token_profiles": "none"}
    mask = {"edit": "mask_keys", "key_frames": "sink"}
    # The head runs first: the first run of a job pays for what is done once (compiling),
    # so the first head run against the others measures it; then the untouched run warm.
    plan = []
    for label in head_labels(runs - 3, num_layers, num_heads):
        layer = int(label[1:].split("H")[0]) - 1
        plan.append((f"sink_per_head/{label}", [layer], atlas_capture, {"interventions": [{**mask, "heads": [label]}]}))
    plan.append(("default", every, {**capture, "token_profiles": "last_block"}, {}))
    frame = {"edit": "mask_keys", "heads": "all", "key_frames": [3]}
    plan.append(("cache_per_frame/f3", every, atlas_capture, {"interventions": [frame]}))
    # Every other head of each layer: half the model's (180 of the 1.3B's 360).
    half = [
        f"L{layer + 1}H{head + 1}"
        for layer in range(num_layers)
        for head in range(num_heads)
        if (layer + head) % 2 == 0
    ]
    plan.append((f"prune_sink/drift_k{len(half)}", every, atlas_capture, {"interventions": [{**mask, "heads": half}]}))
    base = GenerationOptions().to_dict()
    return {
        "checkpoint": checkpoint,
        "compute": {"device": device, "dtype": dtype},
        "generation": base,
        "runs": [
            {
                "variant": variant,
                "groups": [layers],
                "capture": chosen,
                "generation": {
                    k: v
                    for k, v in GenerationOptions.from_config({**base, **edits}).to_dict().items()
                    if base.get(k) != v
                },
            }
            for variant, layers, chosen, edits in plan
        ],
    }


def run_job(workdir: Path, label: str, job: dict, embedding: Path, cache: Path | None) -> dict:
    """One job of several runs in a fresh process: its wall time and what the driver saw."""
    results = workdir / label / "results"
    sources = ["bench" if run["variant"] == "default" else f"bench@{run['variant']}" for run in job["runs"]]
    outputs = [str(results / "extract" / source / "p" / "seed0" / "layers") for source in sources]
    script = JOB_DRIVER.format(
        src=str(ROOT / "src"),
        job=job,
        outputs=outputs,
        embedding=[str(embedding)],
        staging=str(results / ".staging"),
    )
    env = dict(os.environ)
    if cache is not None:  # this benchmark's own compile caches: the first compiled job's are cold
        env.update(TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, env=env)
    wall = time.perf_counter() - began
    if proc.returncode:
        return {"error": proc.stderr[-3000:]}
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    walls = result.pop("run_walls")
    variants = [run["variant"] for run in job["runs"]]
    heads = [w for v, w in zip(variants, walls) if v.startswith("sink_per_head/")]
    timings = result.pop("timings")
    return {
        "wall_seconds": wall,
        # Besides the runs: the interpreter, the imports and its exit (the wall time outside the
        # job function), the model loaded (compiling is lazy: it happens in the first run).
        "start_seconds": wall - result["job_seconds"] + result["load_seconds"],
        **result,
        "runs": len(walls),
        "default_run_seconds": walls[variants.index("default")],
        "head_run_seconds_median": statistics.median(heads[1:] or heads),
        "head_run_seconds_first": heads[0],
        # What a job does once in its first run (compiling): the first head run's extra.
        "first_run_extra_seconds": max(0.0, heads[0] - statistics.median(heads[1:] or heads)),
        "frame_run_seconds": walls[variants.index("cache_per_frame/f3")],
        "prune_run_seconds": walls[next(i for i, v in enumerate(variants) if v.startswith("prune_sink/"))],
        "head_generation_seconds_median": statistics.median(
            t["generation_seconds"] for v, t in zip(variants, timings) if v.startswith("sink_per_head/")
        ),
        "runs_seconds": sum(walls),
    }


def bare_generation(model, context, reps: int) -> dict:
    """Median seconds of a bare generation (nothing captured) after a warm-up."""
    import torch

    from sinkscope.generation.sampler import generate
    from sinkscope.options import GenerationOptions

    options = GenerationOptions()
    times = []
    first = None
    for rep in range(reps + 1):
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
        result = generate(model, context, options=options, seed=0)
        if rep == 0:
            first = result.seconds
            continue
        times.append(result.seconds)
    return {"seconds_median": statistics.median(times), "seconds": times, "first_seconds": first}


def extrapolate(bare: float, job: dict, runs: int) -> dict:
    """The per-run cost over a bare generation and one seed's atlas from a measured job."""
    head = job["head_run_seconds_median"]
    # Each job: its process, imports and load, and what its first run does once (compiling).
    per_job = job["start_seconds"] + job["first_run_extra_seconds"]
    jobs_heads = math.ceil((ATLAS["head"] + ATLAS["default"]) / RUNS_PER_JOB)
    # The pruning runs wait for the head orders: a job of their own (prune_sink/all_k360 waits for nothing).
    jobs_all = math.ceil((ATLAS["head"] + ATLAS["frame"] + ATLAS["default"] + 1) / RUNS_PER_JOB) + 1
    heads_atlas = jobs_heads * per_job + ATLAS["head"] * head + ATLAS["default"] * job["default_run_seconds"]
    whole = (
        jobs_all * per_job
        + ATLAS["head"] * head
        + ATLAS["frame"] * job["frame_run_seconds"]
        + ATLAS["prune"] * job["prune_run_seconds"]
        + ATLAS["default"] * job["default_run_seconds"]
    )
    return {
        "head_run_over_bare": head / bare,
        "job_per_run_over_bare": job["wall_seconds"] / runs / bare,
        "job_overhead_seconds": per_job,
        "head_atlas_jobs": jobs_heads,
        "head_atlas_one_seed_seconds": heads_atlas,
        "head_atlas_one_seed_minutes": heads_atlas / 60,
        "whole_atlas_one_seed_minutes": whole / 60,
        "goals": {
            "per run <= 1.15x a bare generation": head / bare <= 1.15,
            "360-head atlas of one seed < 15 min": heads_atlas < 15 * 60,
        },
    }


def write_release(folder: Path, model) -> float:
    """A Wan release folder (config.json, the weights in fp32 safetensors) of ``model``."""
    from safetensors.torch import save_file

    config = model.config
    fields = ("dim", "ffn_dim", "freq_dim", "in_dim", "out_dim", "num_heads", "num_layers", "eps", "text_len")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps({"_class_name": "WanModel", "model_type": "t2v", **{f: getattr(config, f) for f in fields}})
    )
    began = time.perf_counter()
    save_file(
        {k: v.float().cpu().contiguous() for k, v in model.state_dict().items()},
        str(folder / "diffusion_pytorch_model.safetensors"),
    )
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument(
        "--runs", type=int, default=24, help="runs in the measured job (the untouched, heads, a frame, a prune)"
    )
    parser.add_argument("--reps", type=int, default=3, help="timed bare generations (after one warm-up)")
    parser.add_argument("--budget", type=float, default=520, help="seconds: a section that would not fit is skipped")
    parser.add_argument("--smoke", action="store_true", help="the demo's size on the CPU, to check the script")
    args = parser.parse_args()
    began = time.perf_counter()
    import torch

    from sinkscope.model import build_model, get_model_config, init_random_weights
    from sinkscope.model.text import TextEncoderSpec, save_embedding

    rows = Rows(Path(args.out))
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    name = "demo" if args.smoke else "wan2.1-t2v-1.3b"
    config = get_model_config(name)
    workdir = Path(tempfile.mkdtemp(prefix="sinkscope-atlas-"))
    model = build_model(config, seed=None, device=device, dtype=torch.float32)
    init_random_weights(model, seed=0, device=device)
    dtype = "float32" if args.smoke else "bfloat16"
    model = model.to(getattr(torch, dtype))
    context = torch.randn(1, 24, config.text_dim, generator=torch.Generator().manual_seed(1)).to(device)
    embedding = workdir / "p.safetensors"
    save_embedding(embedding, context[0].cpu(), prompt="benchmark", encoder=TextEncoderSpec("umt5", "wan", "bench"))
    if args.smoke:
        checkpoint = {"name": "bench", "model": "demo", "format": "demo", "weights": None, "seed": 0}
    else:
        release = workdir / "Wan2.1-T2V-1.3B"
        rows.add("setup", {"write_release_seconds": write_release(release, model), "workdir": str(workdir)})
        checkpoint = {"name": "bench", "model": None, "format": "wan", "weights": str(release), "seed": 0}
    checkpoint.update(base=None, ema=True, allow_pickle=False, dtype=dtype, train_step=None)
    if device == "cuda":
        rows.add("env", {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__})

    def left() -> float:
        return args.budget - (time.perf_counter() - began)

    bare = {}
    for mode in ("eager", "compile"):
        if mode == "compile":
            if device != "cuda":
                break
            started = time.perf_counter()
            model.compile_blocks(dynamic=False)
            rows.add("compile_setup", {"seconds": time.perf_counter() - started})
        bare[mode] = bare_generation(model, context, args.reps)
        rows.add(f"bare, {mode}", bare[mode])
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    jobs = {}
    cache = workdir / "compile-cache"
    for mode, compile_ in (("eager", False), ("compile", "auto")):
        if mode not in bare:
            continue
        # A job of 24 runs takes about 25 bare generations, plus start-up and compiling.
        needed = 40 + (args.runs + 2) * bare[mode]["seconds_median"] * 1.3 + (60 if mode == "compile" else 0)
        if left() < needed:
            rows.add(f"job, {mode}", {"skipped": f"{left():.0f} s left of the budget, about {needed:.0f} s needed"})
            continue
        params = job_params(checkpoint, device, dtype, args.runs, config.num_layers, config.num_heads, compile_)
        jobs[mode] = run_job(workdir, mode, params, embedding, cache)
        rows.add(f"job, {mode}", jobs[mode])
        if "error" not in jobs[mode]:
            rows.add(f"atlas, {mode}", extrapolate(bare[mode]["seconds_median"], jobs[mode], args.runs))
    lines = ["| measure | eager | compiled |", "|---|---|---|"]

    def cell(mode: str, key: str, section: str = "atlas") -> str:
        value = rows.summary.get(f"{section}, {mode}", {}).get(key)
        return f"{value:.3g}" if isinstance(value, (int, float)) else "-"

    bare_cells = [cell(mode, "seconds_median", "bare") for mode in ("eager", "compile")]
    lines.append(f"| bare generation, s | {bare_cells[0]} | {bare_cells[1]} |")
    measured = ("head_run_seconds_median", "first_run_extra_seconds", "default_run_seconds", "frame_run_seconds")
    for key in (*measured, "prune_run_seconds", "start_seconds", "wall_seconds"):
        lines.append(f"| job: {key} | {cell('eager', key, 'job')} | {cell('compile', key, 'job')} |")
    for key in (
        "head_run_over_bare",
        "job_per_run_over_bare",
        "head_atlas_one_seed_minutes",
        "whole_atlas_one_seed_minutes",
    ):
        lines.append(f"| {key} | {cell('eager', key)} | {cell('compile', key)} |")
    table = "\n".join(lines)
    (Path(args.out) / "atlas_scale.md").write_text(table + "\n")
    print(table)
    print(f"total {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

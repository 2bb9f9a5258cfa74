"""Krea Realtime 14B at its real shape on one GPU (random bf16 weights; docs/krea-realtime.md).

Wan2.1-T2V-14B (40 layers of 40 heads, dim 5120), 480x832 (1560 tokens a latent frame),
21 latent frames = 7 blocks of 3, 4 steps (t = 1000, 908.84, 713.98, 0), procedure
``krea_recompute`` (per block after the first: the recompute call over 3 context frames,
then 4 denoising calls over a 6-frame cache). Sections (``--sections``):

- ``generation``: one generation uncaptured, with 1 layer (layer 4) and with all 40 layers
  captured (exact capture, token profiles of the last block, rows collected), after a
  warm-up; median of ``--reps``; video FPS (81 video frames / wall seconds) and peak
  memory. The context frames are the kept latents (``recompute_context: latent``).
- ``reencode`` (needs diffusers): uncaptured, the kept latent against Krea's default, the
  oldest context frame re-encoded through a Wan2.1 VAE of random weights: the VAE's cost.
- ``job``: one extraction job in a fresh process, as the workflow runs it: the checkpoint a
  Krea-layout ``.safetensors`` (a flat dict, keys ``model.``; bf16, 28.6 GB written to
  ``--workdir``) with a Wan2.1-T2V-14B base folder (config.json; a random diffusers VAE
  when diffusers is installed), ``layers_per_job: auto`` resolved by
  ``pipeline.resources.auto_layers_per_job`` for this GPU's memory; wall time, the job's
  own timings, peak memory.

``--quick``: the same code on the CPU at a tiny shape (a smoke test; its numbers mean
nothing). Text encoding is in no number (a random context stands in).

    PYTHONPATH=src python benchmarks/krea_speed.py --out $OUT/krea-speed.json
    PYTHONPATH=src python benchmarks/krea_speed.py --quick --out /tmp/krea-quick.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from sinkscope.generation.capture import FrameStatsCapture  # noqa: E402
from sinkscope.generation.krea import krea_denoising_steps  # noqa: E402
from sinkscope.generation.sampler import generate  # noqa: E402
from sinkscope.model import WanConfig, WanModel, get_model_config, init_random_weights  # noqa: E402
from sinkscope.options import GenerationOptions  # noqa: E402
from sinkscope.pipeline.resources import GIB, auto_layers_per_job, estimate_job_memory  # noqa: E402

MODEL = "wan2.1-t2v-14b"
# --quick: the 14B's architecture at a CPU size.
QUICK = WanConfig(
    dim=128,
    ffn_dim=256,
    num_heads=4,
    num_layers=4,
    text_dim=64,
    text_len=16,
    freq_dim=32,
    latent_height=8,
    latent_width=12,
)
LAYER = 4
HAS_DIFFUSERS = importlib.util.find_spec("diffusers") is not None


def krea_generation(frames: int, context: str = "latent") -> dict:
    return {
        "procedure": "krea_recompute",
        "num_frames": frames,
        "denoising_steps": krea_denoising_steps(4),
        "recompute_context": context,
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_model(config: WanConfig, device: torch.device) -> WanModel:
    """Random weights in bf16 (float32 on the CPU), allocated once in that dtype: the 14B
    in float32 would not fit an 80 GB GPU beside its bf16 copy."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device("meta"):
        model = WanModel(config).to(dtype)
    model = model.to_empty(device=device)
    init_random_weights(model, seed=0, device=device)
    return model.eval().requires_grad_(False)


def random_vae(device: torch.device, tiny: bool = False):
    """A Wan2.1 VAE (diffusers' default AutoencoderKLWan config; ``tiny``: 8 base channels,
    for --quick) of random weights, or None without diffusers."""
    if not HAS_DIFFUSERS:
        return None
    from diffusers import AutoencoderKLWan

    from sinkscope.model.vae import WanVAE

    module = AutoencoderKLWan(base_dim=8) if tiny else AutoencoderKLWan()
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for _, parameter in sorted(module.named_parameters()):
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return WanVAE(module.to(device).eval().requires_grad_(False))


def text(config: WanConfig, device: torch.device) -> torch.Tensor:
    return torch.randn(1, min(24, config.text_len), config.text_dim, generator=torch.Generator().manual_seed(1)).to(
        device
    )


def one_generation(model, options, layers, device, vae=None) -> dict:
    fsl = model.config.frame_seq_length()
    sync(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    capture = FrameStatsCapture(model, layers, frame_seq_length=fsl, token_profiles="last_block")
    with capture:
        result = generate(model, text(model.config, device), options=options, seed=42, observers=[capture], vae=vae)
    rows = sum(len(t["frames"]) for t in capture.layer_tables().values()) if layers else 0
    sync(device)
    seconds = time.perf_counter() - began
    return {
        "seconds": seconds,
        "generation_seconds": result.seconds,
        "rows": rows,
        "peak_gib": torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None,
        "kv_cache_gib": result.kv_cache_bytes / GIB,
        "calls": len(result.calls),
        "latents_finite": bool(torch.isfinite(result.latents.float()).all()),
    }


def timed(model, options, layers, device, reps, vae=None) -> dict:
    runs = [one_generation(model, options, layers, device, vae) for _ in range(reps)]
    median = statistics.median(r["seconds"] for r in runs)
    video_frames = 4 * options.num_frames - 3
    return {
        "seconds_median": median,
        "seconds": [r["seconds"] for r in runs],
        "video_fps": video_frames / median,
        "peak_gib": max((r["peak_gib"] or 0) for r in runs) or None,
        "kv_cache_gib": runs[0]["kv_cache_gib"],
        "calls": runs[0]["calls"],
        "rows": runs[0]["rows"],
        "latents_finite": all(r["latents_finite"] for r in runs),
    }


def section_generation(config: WanConfig, device: torch.device, frames: int, reps: int) -> dict:
    model = random_model(config, device)
    options = GenerationOptions.from_config(krea_generation(frames))
    layer = min(LAYER, config.num_layers - 1)
    one_generation(model, options, [layer], device)  # warm-up: kernels (the statistics' Triton JIT too), allocator
    out = {
        "options": options.to_dict(),
        "weights_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / GIB,
    }
    out["no capture"] = timed(model, options, [], device, reps)
    out["1 layer captured"] = timed(model, options, [layer], device, reps)
    out[f"all {config.num_layers} layers captured"] = timed(
        model, options, list(range(config.num_layers)), device, reps
    )
    base = out["no capture"]["seconds_median"]
    for key in ("1 layer captured", f"all {config.num_layers} layers captured"):
        out[key]["overhead_pct"] = 100 * (out[key]["seconds_median"] / base - 1)
    for row in (r for r in out.values() if isinstance(r, dict) and "peak_gib" in r):
        estimate = estimate_job_memory(config, options, "bfloat16", captured_layers=config.num_layers)
        row["estimate_all_layers_gib"] = estimate.total / GIB
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def section_reencode(config: WanConfig, device: torch.device, frames: int, reps: int) -> dict:
    """Krea's default context (the oldest frame re-encoded through a Wan2.1 VAE of random
    weights) against the kept latent, uncaptured: the VAE's cost."""
    vae = random_vae(device, tiny=device.type == "cpu")
    if vae is None:
        return {"skipped": "diffusers is not installed"}
    model = random_model(config, device)
    out = {}
    for context in ("latent", "reencode"):
        options = GenerationOptions.from_config(krea_generation(frames, context))
        one_generation(model, options, [], device, vae)  # warm-up (the VAE's kernels too)
        out[context] = timed(model, options, [], device, reps, vae)
    out["reencode_extra_seconds"] = out["reencode"]["seconds_median"] - out["latent"]["seconds_median"]
    out["estimate_vae_gib"] = (
        estimate_job_memory(
            config, GenerationOptions.from_config(krea_generation(frames, "reencode")), "bfloat16", captured_layers=0
        ).vae
        / GIB
    )
    del model, vae
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


JOB_DRIVER = """
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {src!r})
import torch
from sinkscope.pipeline.extract import extract_job
t1 = time.perf_counter()
meta = extract_job(checkpoint={checkpoint!r}, variant="default", prompt_id="eagle", seed=42, layers={layers!r},
                   output={out!r}, embedding={embedding!r}, weights_sha256="benchmark", generation={generation!r},
                   capture={{"backend": "auto", "attention": "exact", "kernels": "fast", "compile": "auto",
                            "token_profiles": "last_block"}},
                   compute={{"device": {device!r}, "dtype": {dtype!r}}})
t2 = time.perf_counter()
peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
print("RESULT " + json.dumps({{"import_seconds": t1 - t0, "job_seconds": t2 - t1, "timings": meta["timings"],
                              "peak_gib": peak}}))
"""


def write_checkpoint(workdir: Path, config: WanConfig, device: torch.device) -> tuple[Path, Path, dict]:
    """Krea's file layout at ``config``'s shape: the flat ``model.``-prefixed safetensors and a
    Wan2.1-T2V-14B base folder (config.json; a diffusers vae/ when diffusers is installed)."""
    from safetensors.torch import save_file

    from sinkscope.model.text import TextEncoderSpec, save_embedding

    weights = workdir / "krea-realtime-video" / "krea-realtime-video-14b.safetensors"
    base = workdir / "wan_models" / "Wan2.1-T2V-14B"
    weights.parent.mkdir(parents=True, exist_ok=True)
    base.mkdir(parents=True, exist_ok=True)
    fields = (
        "dim",
        "ffn_dim",
        "freq_dim",
        "in_dim",
        "out_dim",
        "num_heads",
        "num_layers",
        "eps",
        "text_len",
        "text_dim",
    )
    (base / "config.json").write_text(
        json.dumps({"_class_name": "WanModel", "model_type": "t2v", **{f: getattr(config, f) for f in fields}})
    )
    timings = {}
    began = time.perf_counter()
    model = random_model(config, device)
    state = {
        f"model.{k}": v.to("cpu", torch.bfloat16 if device.type == "cuda" else torch.float32).contiguous()
        for k, v in model.state_dict().items()
    }
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    save_file(state, str(weights))
    del state
    timings["write_weights_seconds"] = time.perf_counter() - began
    vae = random_vae(torch.device("cpu"), tiny=device.type == "cpu")
    if vae is not None:
        vae.module.save_pretrained(base / "vae")
    embedding = workdir / "eagle.safetensors"
    save_embedding(
        embedding,
        text(config, torch.device("cpu"))[0],
        prompt="benchmark",
        encoder=TextEncoderSpec("umt5", "wan", str(base)),
    )
    timings["weights_gib"] = weights.stat().st_size / GIB
    return weights, embedding, timings


def section_job(config: WanConfig, device: torch.device, frames: int, workdir: Path) -> dict:
    weights, embedding, out = write_checkpoint(workdir, config, device)
    context = "reencode" if HAS_DIFFUSERS else "latent"
    options = GenerationOptions.from_config(krea_generation(frames, context))
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    layers_per_job = auto_layers_per_job(config, options, dtype, layers=config.num_layers, memory_bytes=memory)
    out.update(
        recompute_context=context,
        layers_per_job_auto=layers_per_job,
        device_memory_gib=(memory or 0) / GIB,
        estimate_gib=estimate_job_memory(config, options, dtype, captured_layers=layers_per_job).total / GIB,
    )
    checkpoint = {
        "name": "krea_realtime_14b",
        "model": None,
        "format": "wan",
        "weights": str(weights),
        "base": str(weights.parent.parent / "wan_models" / "Wan2.1-T2V-14B"),
        "seed": 0,
        "ema": True,
        "allow_pickle": False,
        "dtype": dtype,
        "train_step": None,
    }
    script = JOB_DRIVER.format(
        src=str(ROOT / "src"),
        checkpoint=checkpoint,
        layers=list(range(layers_per_job)),
        out=str(workdir / "extract"),
        embedding=str(embedding),
        generation=options.to_dict(),
        device=str(device),
        dtype=dtype,
    )
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=1500)
    out["wall_seconds"] = time.perf_counter() - began
    if proc.returncode:
        out["error"] = proc.stderr[-4000:]
        return out
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    out.update(json.loads(line[len("RESULT ") :]))
    out["output_mib"] = sum(p.stat().st_size for p in (workdir / "extract").rglob("*") if p.is_file()) / 2**20
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("OUT", "."), "krea-speed.json"), help="the JSON file"
    )
    parser.add_argument("--sections", default="generation,reencode,job")
    parser.add_argument("--frames", type=int, default=21, help="latent frames (21 = 7 blocks = 81 video frames)")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--workdir", default=None, help="where the job section writes its 28.6 GB checkpoint")
    parser.add_argument("--quick", action="store_true", help="a CPU smoke test at a tiny shape")
    args = parser.parse_args()
    device = torch.device("cpu" if args.quick else "cuda")
    config = QUICK if args.quick else get_model_config(MODEL)
    frames = 9 if args.quick else args.frames
    results: dict = {
        "model": "quick" if args.quick else MODEL,
        "frames": frames,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "diffusers": HAS_DIFFUSERS,
    }
    sections = [s for s in args.sections.split(",") if s]
    status = 0
    for section in sections:
        began = time.perf_counter()
        try:
            if section == "generation":
                results[section] = section_generation(config, device, frames, 1 if args.quick else args.reps)
            elif section == "reencode":
                results[section] = section_reencode(config, device, frames, 1 if args.quick else args.reps)
            elif section == "job":
                with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
                    results[section] = section_job(config, device, frames, Path(workdir))
            else:
                raise ValueError(f"unknown section {section!r} (generation, reencode, job)")
        except Exception:  # noqa: BLE001 - a failed section is recorded; the others still run
            results[section] = {"error": traceback.format_exc()[-4000:]}
            status = 1
        results.setdefault("section_seconds", {})[section] = time.perf_counter() - began
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
        print(json.dumps({section: results[section]}, indent=2)[:3000], flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())

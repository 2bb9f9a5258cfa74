"""Speed and memory of LongLive 2.0's *own* inference pipeline at the real 5B shape.

Runs NVlabs/LongLive's ``CausalDiffusionInferencePipeline`` (their code, Apache-2.0, commit
``7860ad9685686bc3edfd407eb4d12579ca47d689``, recorded in the output as ``upstream.commit``)
with random bf16 weights at Wan2.2-TI2V-5B's shape (30 layers, dim 3072, 24 heads, 48 latent
channels), their ``configs/inference.yaml`` (chunks of 8, window 32 + sink 8, multi-shot sink,
UniPC 4 steps with shift 5, the clean t=0 pass, guidance 1) and 704x1280 video (44x80 latents,
880 tokens a frame), as their README quickstart does it (a merged generator: no PEFT LoRA
wrapper; ``--lora`` wraps the model in their unmerged rank-128 LoRA as ``inference.py`` does
when the config's ``adapter`` section is kept). Eager, as their config (no ``torch_compile``).
It is the counterpart of ``benchmarks/longlive2_speed.py``, which times sinkscope's own
generation of the same shape: run both in one GPU call to compare.

For each ``--frames`` length (default 64 and 128 latent frames): one warm-up
``pipeline.inference(..., return_latents=True)`` then ``--reps`` timed ones, each between
``torch.cuda.synchronize()`` calls; reported: seconds median/min/max, video FPS
((4 F - 3) / seconds, the Wan2.2 VAE's 4x temporal stride, as longlive2_speed.py), ms a chunk,
peak ``torch.cuda.max_memory_allocated``. Not timed or not run: the text encoder (a fixed random
context stands in for umT5's 512x4096 output) and the VAE (latents are returned). Noise is
drawn before the clock starts. Writes ``results.json`` to ``--out`` (default $OUT or
./benchmark-out) and prints it.

What is bypassed or shimmed, and why (each applied shim is listed in the output's ``shims``):

- weights: ``CausalWanModel.from_pretrained`` (reads ``wan_models/Wan2.2-TI2V-5B/``) is swapped,
  while the pipeline builds its ``WanDiffusionWrapper``, for a direct constructor call with the
  5B's config.json values (their own xavier init, seeded), then cast to bf16 as their
  ``inference.py`` does;
- text encoder / VAE: passed to the pipeline's constructor as stand-ins (no umT5 or VAE files);
- flash attention: their ``attention()`` already falls back to torch SDPA when neither
  flash_attn nor flash_attn_interface imports, but the cross-attention calls ``flash_attention``
  directly, which asserts CUDA and flash_attn (attention.py:114, causal_model.py:238); where
  flash_attn is missing it is replaced (in attention.py, model.py and causal_model.py) by the
  same SDPA call their ``attention()`` fallback makes;
- Triton RoPE / adaLN kernels: left at their defaults (on) on CUDA; on CPU (``--quick``)
  ``LLV2_TRITON_ROPE=0`` and ``LLV2_TRITON_ADALN=0`` are set before import (fp64/eager paths);
- imports the GPU image lacks, stubbed only when the import fails: ``omegaconf`` (only
  ``OmegaConf.load/create/merge`` on plain dicts are needed to read their yaml through their
  ``normalize_config``; the real one needs antlr4, which has no wheel), ``ftfy`` (the umT5
  tokenizer's text cleaner; the tokenizer is not run), ``transformers...x_clip_loss`` (imported
  by causal_model.py, unused, gone in transformers 5), ``utils.dataset`` (imported for one
  string constant; it needs torchvision, read from their file instead);
- ``pipeline/__init__.py`` is not run (it imports the training pipeline too): the package is
  registered bare and ``pipeline.causal_diffusion_inference`` imported from it;
- diffusers (their ConfigMixin/ModelMixin and UniPC scheduler base) is real: the GPU image has
  none, so it travels as a wheel (their pin, diffusers==0.31.0, in .whl/);
- tqdm bars are silenced (``TQDM_DISABLE=1``) and their prints go to stderr.

``--quick``: a CPU smoke run of the same path on a tiny model (2 layers, dim 64, 2 heads, 4x6
latents, chunks of 2, window 8 + sink 2, 16 and 32 latent frames) in bf16 (their SDPA fallback
casts to bf16 anyway); the pipeline's size table (``wan_default_config``) is patched to match.
It checks the script, not speed.

Reproduce: ``git clone https://github.com/NVlabs/LongLive && git -C LongLive checkout
7860ad9685686bc3edfd407eb4d12579ca47d689``, then pass ``--longlive-root LongLive`` (default
``third_party/LongLive``: an untracked export of that commit, with its hash in
``UPSTREAM_COMMIT``). On the GPU machine (the device call carries ``third_party/LongLive`` and
``.whl``, both ignored through .git/info/exclude):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/diffusers-0.31.0-py3-none-any.whl && export PYTHONPATH=/tmp/site
    python3 benchmarks/longlive2_theirs.py --out $OUT/theirs          # theirs, 64 and 128 frames
    python3 benchmarks/longlive2_speed.py --out $OUT/ours             # ours, same call, same GPU

Here (CPU; diffusers and einops importable): ``python3 benchmarks/longlive2_theirs.py --quick
--out /tmp/ll2theirs``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from pathlib import Path

# Their pipeline opens a tqdm bar per chunk; tqdm reads TQDM_* at import (torch imports it).
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from upstream import (  # noqa: E402
    FixedTextEncoder,
    GiB,
    bare_package,
    not_run,
    patch_flash_attention,
    random_weights,
    stub_missing,
    stub_module,
    time_generations,
    tiny_wan,
    umt5_context,
    upstream_commit,
)

from report import error_entry, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = "https://github.com/NVlabs/LongLive"
EXPECTED_COMMIT = "7860ad9685686bc3edfd407eb4d12579ca47d689"
# wan_models/Wan2.2-TI2V-5B/config.json (also their wan_5b/configs/wan_ti2v_5B.py); the rest
# (patch (1,2,2), text_dim 4096, qk_norm, cross_attn_norm) are CausalWanModel's defaults.
REAL_5B = dict(
    model_type="ti2v",
    dim=3072,
    ffn_dim=14336,
    freq_dim=256,
    in_dim=48,
    out_dim=48,
    num_heads=24,
    num_layers=30,
    text_len=512,
    eps=1e-6,
)
QUICK = tiny_wan("ti2v", 48)


def install_shims(root: Path, cpu: bool) -> list[str]:
    """Make their inference path importable here; return what was shimmed."""
    shims = []
    # Their modules import each other as top-level packages (utils, wan_5b, pipeline).
    sys.path.insert(0, str(root))
    if cpu:  # their Triton kernels need CUDA; the flags are read at import
        os.environ["LLV2_TRITON_ROPE"] = "0"
        os.environ["LLV2_TRITON_ADALN"] = "0"
        shims.append("LLV2_TRITON_ROPE=0, LLV2_TRITON_ADALN=0 (CPU)")
    stub_missing(shims, "omegaconf", "dict-backed: load/create/merge/is_config/to_container")
    stub_missing(shims, "ftfy", "umT5 tokenizer not run", fix_text=not_run)
    try:
        import transformers.models.x_clip.modeling_x_clip as x_clip
    except ImportError:
        x_clip = stub_module("transformers.models.x_clip.modeling_x_clip")
    if not hasattr(x_clip, "x_clip_loss"):
        x_clip.x_clip_loss = not_run
        shims.append("transformers x_clip_loss: stub (imported, unused)")
    # pipeline/__init__.py also imports the training pipeline (torchvision.io.write_video).
    bare_package("pipeline", root / "pipeline")
    shims.append("pipeline/__init__.py not run (bare package)")
    try:
        import utils.dataset  # noqa: F401
    except ImportError:  # torchvision missing: only DEFAULT_SCENE_CUT_PREFIX is needed
        text = (root / "utils" / "dataset.py").read_text()
        prefix = re.search(r'^DEFAULT_SCENE_CUT_PREFIX = "(.*)"', text, re.M).group(1)
        stub_module("utils.dataset", DEFAULT_SCENE_CUT_PREFIX=prefix)
        shims.append("utils.dataset: DEFAULT_SCENE_CUT_PREFIX read from the file (torchvision missing)")
    return shims


def patch_attention() -> str:
    """Route their direct ``flash_attention`` calls to SDPA where flash_attn is missing."""
    from wan_5b.modules import attention, causal_model, model

    return patch_flash_attention(attention, model, causal_model)


def load_config(root: Path, chunk: int, window: int, sink: int, height: int, width: int):
    from omegaconf import OmegaConf
    from utils.config import normalize_config

    config = OmegaConf.load(str(root / "configs" / "inference.yaml"))
    config.model_kwargs.num_frame_per_block = chunk
    config.model_kwargs.local_attn_size = window
    config.inference.sink_size = sink
    config = normalize_config(config)
    config.image_or_video_shape = [1, 8 * chunk, 48, height, width]  # frame count comes from the noise
    return config


def time_length(pipe, frames: int, chunk: int, shape: list[int], reps: int, device: torch.device) -> dict:
    """One warm-up and ``reps`` timed generations of ``frames`` latent frames."""
    noise = torch.randn(
        [1, frames, *shape],
        device=device,
        dtype=torch.bfloat16,
        generator=torch.Generator(device=device).manual_seed(0),
    )
    prompts = [["a random-weight benchmark prompt"] * (frames // chunk)]  # one prompt block a chunk
    timed = time_generations(
        lambda: pipe.inference(noise=noise, text_prompts=prompts, return_latents=True), reps, device
    )
    median = timed["seconds_median"]
    return {
        "latent_frames": frames,
        "chunks": frames // chunk,
        **timed,
        "video_fps": (4 * frames - 3) / median,
        "ms_per_chunk": 1000 * median / (frames // chunk),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--frames", default="64,128", help="latent frame counts, comma-separated")
    parser.add_argument("--reps", type=int, default=2, help="timed generations per length (after one warm-up)")
    parser.add_argument(
        "--longlive-root", default=str(ROOT / "third_party" / "LongLive"), help="a checkout of NVlabs/LongLive"
    )
    parser.add_argument("--lora", action="store_true", help="wrap the generator in their unmerged rank-128 LoRA")
    parser.add_argument("--quick", action="store_true", help="CPU smoke run on a tiny model")
    args = parser.parse_args()

    root = Path(args.longlive_root).resolve()
    if not (root / "pipeline" / "causal_diffusion_inference.py").exists():
        parser.error(f"{root} is not a LongLive checkout (clone {UPSTREAM})")
    frames = [int(f) for f in args.frames.split(",")]
    if args.quick:
        device, model_config = torch.device("cpu"), QUICK
        chunk, window, sink, height, width = 2, 8, 2, 4, 6
        frames = [f // 4 for f in frames]  # 16 and 32 latent frames
        context_len = QUICK["text_len"]
    else:
        if not torch.cuda.is_available():
            parser.error("the real shape needs CUDA; --quick runs a CPU smoke test")
        device, model_config = torch.device("cuda"), REAL_5B
        chunk, window, sink, height, width = 8, 32, 8, 44, 80
        context_len = REAL_5B["text_len"]
    shims = install_shims(root, cpu=device.type == "cpu")
    attention_backend = patch_attention()

    from pipeline.causal_diffusion_inference import CausalDiffusionInferencePipeline
    from utils.config import wan_default_config

    config = load_config(root, chunk, window, sink, height, width)
    if args.quick:  # the pipeline sizes its caches from this table, not from the model
        wan_default_config[config.model_kwargs.model_name].update(
            num_heads=QUICK["num_heads"],
            head_dim=QUICK["dim"] // QUICK["num_heads"],
            num_transformer_blocks=QUICK["num_layers"],
        )
        shims.append("wan_default_config sizes set to the tiny model (quick)")
    # umT5's output: 512 x 4096 rows, padding rows zeroed (a short prompt: 24 tokens).
    context = umt5_context(24, context_len, model_config.get("text_dim", 4096), device)

    began = time.perf_counter()
    from wan_5b.modules.causal_model import CausalWanModel

    with random_weights(CausalWanModel, model_config, str(device), seed=0), contextlib.redirect_stdout(sys.stderr):
        pipe = CausalDiffusionInferencePipeline(
            config, device=device, text_encoder=FixedTextEncoder(context), vae=torch.nn.Module()
        )
    if args.lora:  # as inference.py with the adapter section kept and merge_lora false
        from utils.lora_utils import configure_lora_for_model

        with contextlib.redirect_stdout(sys.stderr):
            pipe.generator.model = configure_lora_for_model(pipe.generator.model, "generator", config.adapter)
    pipe.generator.to(device=device, dtype=torch.bfloat16)  # inference.py: pipeline.to(dtype=torch.bfloat16)
    pipe.generator.model.eval().requires_grad_(False)
    build_seconds = time.perf_counter() - began
    if device.type == "cuda":
        torch.cuda.empty_cache()

    results: dict = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "upstream": {
            "repo": UPSTREAM,
            "commit": upstream_commit(root),
            "root": str(root),
            "pipeline": "pipeline.causal_diffusion_inference.CausalDiffusionInferencePipeline",
            "config": "configs/inference.yaml",
        },
        "model": model_config,
        "chunk": chunk,
        "window": window,
        "sink": sink,
        "latent_hw": [height, width],
        "frame_seq_length": pipe.frame_seq_length,
        "sampling_steps": pipe.sampling_steps,
        "shift": pipe.shift,
        "lora": args.lora,
        "reps": args.reps,
        "attention": attention_backend,
        "triton": {k: os.environ.get(k, "1 (default)") for k in ("LLV2_TRITON_ROPE", "LLV2_TRITON_ADALN")},
        "env": {k: v for k, v in os.environ.items() if k.startswith("LLV2_")},
        "shims": shims,
        "weights_gib": sum(p.numel() * p.element_size() for p in pipe.generator.parameters()) / GiB,
        "build_seconds": build_seconds,
    }
    if results["upstream"]["commit"] != EXPECTED_COMMIT:
        print(f"warning: LongLive commit {results['upstream']['commit']} is not {EXPECTED_COMMIT}", file=sys.stderr)
    shape = [48, height, width]
    for n in frames:
        label = f"{n} frames"
        try:
            results[label] = time_length(pipe, n, chunk, shape, args.reps, device)
        except Exception as error:  # noqa: BLE001 - report, keep going
            results[label] = error_entry(error)
    timesteps = getattr(pipe, "timesteps", None)
    results["timesteps"] = timesteps.tolist() if timesteps is not None else None
    return write_results(results, args.out)


if __name__ == "__main__":
    raise SystemExit(main())

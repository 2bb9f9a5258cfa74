"""Speed and memory of Self-Forcing's *own* inference pipeline at the real 1.3B shape.

Runs guandeh17/Self-Forcing's ``CausalInferencePipeline`` (their code, Apache-2.0,
commit ``33593df3e81fa3ec10239271dd2c100facac6de1``, recorded in the
output as ``upstream.commit``) with random bf16 weights at Wan2.1-T2V-1.3B's shape (30 layers,
dim 1536, 12 heads, FFN 8960, 16 latent channels), their ``configs/self_forcing_dmd.yaml`` merged
over ``configs/default_config.yaml`` as their ``inference.py`` merges them (blocks of 3 frames,
the steps 1000/750/500/250 warped by the shift of 5 to 1000/937.5/833.3/625, the clean context
pass at t = 0) and 480x832 video
(60x104 latents, 1560 tokens a frame, 21 latent frames = 81 video frames). Eager, as their
``inference.py`` runs it. It is the counterpart of ``gpu_benchmark.py --sections generation``,
which times sinkscope's generation of the same shape: run both in one GPU call to compare.

One warm-up ``pipeline.inference(..., return_latents=True)`` then ``--reps`` timed ones, each
between ``torch.cuda.synchronize()`` calls; reported: seconds median/min/max, video FPS
(81 / seconds for 21 latent frames: (4 F - 3) / seconds, the VAE's 4x temporal stride), ms a
block, peak ``torch.cuda.max_memory_allocated``. Not timed or not run: the text encoder (a fixed
random context stands in for umT5's 512x4096 output) and the VAE (their pipeline always decodes
at its end; a stand-in returns the latents as they are, so the timed run is the generation and
the pipeline's own (video * 0.5 + 0.5).clamp on the latents). Noise is drawn before the clock.
Writes ``results.json`` to ``--out`` (default $OUT or ./benchmark-out) and prints it.

What is bypassed or shimmed (each applied shim is listed in the output's ``shims``):

- weights: ``CausalWanModel.from_pretrained`` (reads ``wan_models/Wan2.1-T2V-1.3B/``) is
  swapped, while the pipeline builds its ``WanDiffusionWrapper``, for a direct constructor call
  with the 1.3B's config.json values (their own init, seeded), then cast to bf16 as their
  ``inference.py`` does (``pipeline.to(dtype=torch.bfloat16)``);
- text encoder / VAE: passed to the pipeline's constructor as stand-ins (no umT5 or VAE files);
- FlashAttention: their ``attention()`` (the KV-cache self-attention) falls back to torch SDPA
  when neither flash_attn nor flash_attn_interface imports; the cross-attention calls
  ``flash_attention`` directly, which asserts flash_attn, so where it is missing that call is
  routed to the same SDPA call (``upstream.patch_flash_attention``). On a Hopper GPU with
  FlashAttention 3 installed their code would take it; it is not installable on the lent
  machine. FlashAttention-4 (``flash_attn.cute``) must not be on ``sys.path``: its
  ``flash_attn`` namespace package makes their ``import flash_attn`` succeed without FA2;
- ``wan/__init__.py``, ``wan/modules/__init__.py`` and ``pipeline/__init__.py`` are not run
  (they import Wan's I2V/T2V wrappers, xfuser, the training pipeline): the packages are
  registered bare and the inference path's modules imported from them;
- imports the GPU image may lack, stubbed only when the import fails: ``omegaconf`` (only
  ``OmegaConf.load/merge`` on plain dicts), ``ftfy`` and ``regex`` (the umT5 tokenizer's, not
  run), ``einops`` (``model.py`` imports ``repeat`` for the GAN branch, ``vae.py`` ``rearrange``:
  neither runs here), ``demo_utils.memory`` and ``wan.modules.t5`` on a machine without CUDA
  (``--quick``; both read the current CUDA device at import);
- their per-step prints go to stderr.

``--quick``: a CPU smoke run of the same path on a tiny model (2 layers, dim 64, 2 heads,
4x6 latents, 21 frames) in bf16; their pipeline hard-codes the 1.3B's cache sizes (30 blocks,
1560 tokens a frame, 12 heads of 128, 32760 keys, 512 text tokens), so ``--quick`` sets those
from the tiny model (listed in ``shims``). It checks the script, not speed.

Reproduce: ``git clone https://github.com/guandeh17/Self-Forcing && git -C Self-Forcing checkout
33593df3e81fa3ec10239271dd2c100facac6de1``, then pass ``--self-forcing-root Self-Forcing``
(default ``third_party/Self-Forcing``: an untracked export of that commit, with its hash in
``UPSTREAM_COMMIT``). On the GPU machine (the device call carries ``third_party/Self-Forcing``
and the diffusers wheel, both ignored through .git/info/exclude):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site2 .whl45/diffusers-*.whl
    PYTHONPATH=/tmp/site2 python3 benchmarks/self_forcing_theirs.py --out $OUT/theirs
    python3 benchmarks/gpu_benchmark.py --sections env,generation --modes eager --out $OUT/ours

Here (CPU; diffusers importable): ``python3 benchmarks/self_forcing_theirs.py --quick --out
/tmp/sftheirs``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import types
from pathlib import Path

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
UPSTREAM = "https://github.com/guandeh17/Self-Forcing"
EXPECTED_COMMIT = "33593df3e81fa3ec10239271dd2c100facac6de1"
# wan_models/Wan2.1-T2V-1.3B/config.json; patch (1,2,2), text_dim 4096, qk_norm and
# cross_attn_norm are CausalWanModel's defaults.
REAL_13B = dict(
    model_type="t2v",
    dim=1536,
    ffn_dim=8960,
    freq_dim=256,
    in_dim=16,
    out_dim=16,
    num_heads=12,
    num_layers=30,
    text_len=512,
    eps=1e-6,
)
QUICK = tiny_wan("t2v", 16)


def install_shims(root: Path, cuda: bool) -> list[str]:
    """Make their inference path importable here; return what was shimmed."""
    shims = []
    sys.path.insert(0, str(root))  # their modules import each other as top-level packages
    stub_missing(shims, "omegaconf", "dict-backed: load/merge")
    stub_missing(shims, "ftfy", "umT5 tokenizer not run", fix_text=not_run)
    stub_missing(shims, "regex", "umT5 tokenizer not run", sub=not_run)
    stub_missing(shims, "einops", "GAN branch and VAE not run", repeat=not_run, rearrange=not_run)
    for package in ("wan", "wan.modules", "pipeline"):
        bare_package(package, root.joinpath(*package.split(".")))
    shims.append("wan/, wan/modules/ and pipeline/ __init__.py not run (bare packages)")
    if not cuda:  # demo_utils/memory.py reads torch.cuda.current_device() at import
        bare_package("demo_utils", root / "demo_utils")
        stub_module(
            "demo_utils.memory",
            gpu=torch.device("cpu"),
            get_cuda_free_memory_gb=not_run,
            DynamicSwapInstaller=types.SimpleNamespace(install_model=not_run),
            move_model_to_device_with_memory_preservation=not_run,
        )
        stub_module("wan.modules.t5", umt5_xxl=not_run)  # a default argument reads the CUDA device
        shims.append("demo_utils.memory, wan.modules.t5: stubs (no CUDA; low_memory paths and umT5 not run)")
    return shims


def patch_attention() -> str:
    """Route their direct ``flash_attention`` calls to SDPA where flash_attn is missing."""
    from wan.modules import attention, causal_model, model

    return patch_flash_attention(attention, model, causal_model)


class PassThroughVAE(torch.nn.Module):
    """Stands in for ``WanVAEWrapper``: their pipeline decodes at its end; this returns the
    latents (the decode is in no number here, as in sinkscope's)."""

    def decode_to_pixel(self, latent: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        return latent


def load_config(root: Path):
    """Their ``inference.py``'s config: self_forcing_dmd.yaml merged over default_config.yaml."""
    from omegaconf import OmegaConf

    default = OmegaConf.load(str(root / "configs" / "default_config.yaml"))
    return OmegaConf.merge(default, OmegaConf.load(str(root / "configs" / "self_forcing_dmd.yaml")))


def resize_caches(pipe, model_config: dict, tokens_per_frame: int, frames: int) -> list[str]:
    """``--quick`` only: their pipeline sizes its caches for the 1.3B; size them for the tiny
    model instead (same layout, their own initializers' code path otherwise)."""
    heads = model_config["num_heads"]
    head_dim = model_config["dim"] // heads
    layers, text_len = model_config["num_layers"], model_config["text_len"]
    pipe.num_transformer_blocks = layers
    pipe.frame_seq_length = tokens_per_frame

    def kv_cache(batch_size, dtype, device):
        shape = [batch_size, frames * tokens_per_frame, heads, head_dim]
        pipe.kv_cache1 = [
            {
                "k": torch.zeros(shape, dtype=dtype, device=device),
                "v": torch.zeros(shape, dtype=dtype, device=device),
                "global_end_index": torch.tensor([0], dtype=torch.long, device=device),
                "local_end_index": torch.tensor([0], dtype=torch.long, device=device),
            }
            for _ in range(layers)
        ]

    def crossattn_cache(batch_size, dtype, device):
        shape = [batch_size, text_len, heads, head_dim]
        pipe.crossattn_cache = [
            {
                "k": torch.zeros(shape, dtype=dtype, device=device),
                "v": torch.zeros(shape, dtype=dtype, device=device),
                "is_init": False,
            }
            for _ in range(layers)
        ]

    pipe._initialize_kv_cache = kv_cache
    pipe._initialize_crossattn_cache = crossattn_cache
    return [f"cache sizes set to the tiny model: {layers} blocks, {tokens_per_frame} tokens a frame (quick)"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--frames", type=int, default=21, help="latent frames (a multiple of 3)")
    parser.add_argument("--reps", type=int, default=3, help="timed generations (after one warm-up)")
    parser.add_argument(
        "--self-forcing-root",
        default=str(ROOT / "third_party" / "Self-Forcing"),
        help="a checkout of guandeh17/Self-Forcing",
    )
    parser.add_argument("--quick", action="store_true", help="CPU smoke run on a tiny model")
    args = parser.parse_args()

    root = Path(args.self_forcing_root).resolve()
    if not (root / "pipeline" / "causal_inference.py").exists():
        parser.error(f"{root} is not a Self-Forcing checkout (clone {UPSTREAM})")
    if args.quick:
        device, model_config, height, width = torch.device("cpu"), QUICK, 4, 6
    else:
        if not torch.cuda.is_available():
            parser.error("the real shape needs CUDA; --quick runs a CPU smoke test")
        device, model_config, height, width = torch.device("cuda"), REAL_13B, 60, 104
    shims = install_shims(root, cuda=device.type == "cuda")
    attention_backend = patch_attention()

    from pipeline.causal_inference import CausalInferencePipeline
    from wan.modules.causal_model import CausalWanModel

    config = load_config(root)
    context = umt5_context(24, model_config["text_len"], model_config.get("text_dim", 4096), device)
    began = time.perf_counter()
    with random_weights(CausalWanModel, model_config, str(device), seed=0), contextlib.redirect_stdout(sys.stderr):
        pipe = CausalInferencePipeline(
            config, device=device, text_encoder=FixedTextEncoder(context), vae=PassThroughVAE()
        )
    if args.quick:
        shims += resize_caches(pipe, model_config, (height // 2) * (width // 2), args.frames)
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
            "pipeline": "pipeline.causal_inference.CausalInferencePipeline",
            "config": "configs/self_forcing_dmd.yaml over configs/default_config.yaml",
        },
        "model": model_config,
        "frames_per_block": pipe.num_frame_per_block,
        "denoising_steps": pipe.denoising_step_list.tolist(),
        "latent_hw": [height, width],
        "reps": args.reps,
        "attention": attention_backend,
        "shims": shims,
        "weights_gib": sum(p.numel() * p.element_size() for p in pipe.generator.parameters()) / GiB,
        "build_seconds": build_seconds,
    }
    if results["upstream"]["commit"] != EXPECTED_COMMIT:
        print(f"warning: Self-Forcing commit {results['upstream']['commit']} is not {EXPECTED_COMMIT}", file=sys.stderr)
    frames = args.frames
    noise = torch.randn(
        [1, frames, model_config["in_dim"], height, width],
        device=device,
        dtype=torch.bfloat16,
        generator=torch.Generator(device=device).manual_seed(0),
    )
    label = f"{frames} frames"
    try:
        timed = time_generations(
            lambda: pipe.inference(noise=noise, text_prompts=["a random-weight benchmark prompt"], return_latents=True)[
                1
            ],
            args.reps,
            device,
        )
        blocks = frames // pipe.num_frame_per_block
        results[label] = {
            "latent_frames": frames,
            "blocks": blocks,
            **timed,
            "video_fps": (4 * frames - 3) / timed["seconds_median"],
            "ms_per_block": 1000 * timed["seconds_median"] / blocks,
        }
    except Exception as error:  # noqa: BLE001 - report, keep going
        results[label] = error_entry(error)
    return write_results(results, args.out)


if __name__ == "__main__":
    raise SystemExit(main())

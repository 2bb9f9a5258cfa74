"""The Wan VAE decode of ``outputs.video`` at the real sizes: time and peak device memory a
video, by latent frames a call, against ``decode_bytes`` (the budget's bound),
and that every call size gives the frames of one-frame calls.

Random weights of the release's shape (diffusers' AutoencoderKLWan; the Wan2.1 VAE at
480x832, 21 latent frames = 81 video frames; the Wan2.2 VAE at 704x1280, 8 latent frames).

    python benchmarks/vae_decode.py [--dtype float32] [--calls 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from sinkscope.model.vae import LATENT_NORMALIZATION, WanVAE, decode_bytes

WAN22 = {
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "latents_mean": list(LATENT_NORMALIZATION[48][0]),
    "latents_std": list(LATENT_NORMALIZATION[48][1]),
}
CASES = {"wan2.1": ({}, (21, 60, 104)), "wan2.2": (WAN22, (8, 44, 80))}


def main() -> None:
    from diffusers import AutoencoderKLWan

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--calls", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    results = []
    for name, (config, (frames, height, width)) in CASES.items():
        torch.manual_seed(0)
        module = AutoencoderKLWan(**config).to("cuda", dtype).eval()
        with torch.no_grad():
            for parameter in module.parameters():  # O(1) activations, as trained weights give
                parameter.mul_(0.5)
        vae = WanVAE(module)
        latents = torch.randn(1, vae.z_dim, frames, height, width, device="cuda")
        reference = None
        for per_call in args.calls:
            vae.decode(latents[:, :, :2], frames_per_call=per_call)  # warm-up
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            began = time.perf_counter()
            video = vae.decode(latents, frames_per_call=per_call)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - began
            peak = torch.cuda.max_memory_allocated() - base
            reference = video if reference is None else reference
            estimate = decode_bytes(vae.config, height, width, per_call, torch.finfo(dtype).bits // 8)
            results.append(
                {
                    "vae": name,
                    "dtype": args.dtype,
                    "latent_frames": frames,
                    "size": list(video.shape[1:3]),
                    "frames_per_call": per_call,
                    "seconds": round(seconds, 3),
                    "video_fps": round(video.shape[0] / seconds, 1),
                    "peak_gib": round(peak / 2**30, 2),
                    "estimate_gib": round(estimate / 2**30, 2),
                    "max_uint8_diff_vs_first": int((video.int() - reference.int()).abs().max()),
                }
            )
            print(json.dumps(results[-1]), flush=True)
        del module, vae
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

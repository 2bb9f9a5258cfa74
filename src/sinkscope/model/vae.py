"""The Wan VAE: latents to video frames and back, through diffusers' ``AutoencoderKLWan``.

One path for every use: decoding a run's final latents into its video (``outputs.video``),
and encoding a decoded frame again (Krea Realtime's KV recomputation). The module is
diffusers' own; sinkscope only reads the weights and drives its causal loop in chunks.

Weights, in either layout (``load_vae``):

- a diffusers ``vae/`` folder (``config.json`` and ``diffusion_pytorch_model.safetensors``),
  as the ``-Diffusers`` releases ship it;
- the original ``Wan2.1_VAE.pth`` (z_dim 16, stride 4x8x8) or ``Wan2.2_VAE.pth`` (z_dim 48,
  stride 4x16x16, residual up/down blocks, 2x2 pixel patches), renamed to diffusers' keys as
  diffusers' ``scripts/convert_wan_to_diffusers.py`` does (``diffusers_key``), the module's
  config read from the tensors' shapes (``original_config``).

Latents are normalized as the generators see them: (mu - latents_mean) / latents_std per
channel (the config's ``latents_mean`` / ``latents_std``). ``decode`` takes them and gives
uint8 frames [T, H, W, 3]; ``encode`` takes frames and gives them back.

The decoder is causal in time with a feature cache: latent frame 0 decodes alone to one
video frame, every later latent frame to 4, each seeing the cached features of the frames
before it. ``decode`` runs latent frame 0 alone (as diffusers does: its temporal upsampler
treats the first call specially) and the rest in calls of ``frames_per_call`` latent frames
sized to a memory budget; each call's frames go to the host as uint8 at once, so the device
holds one call's activations and the cache, never the video. Any call size gives the frames
of diffusers' whole ``decode`` (tests/test_video.py). The encoder mirrors it: pixel frame 0
alone, then groups of 4.

torch and diffusers are imported when a VAE is loaded: importing sinkscope needs neither.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sinkscope.errors import WeightsError

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "WanVAE",
    "decode_bytes",
    "diffusers_key",
    "load_vae",
    "original_config",
    "original_state_dict",
]

# The latent normalization of each release (the generators' latents are normalized with it).
WAN21_LATENTS_MEAN = (
    -0.7571,
    -0.7089,
    -0.9113,
    0.1075,
    -0.1745,
    0.9653,
    -0.1517,
    1.5508,
    0.4134,
    -0.0715,
    0.5517,
    -0.3632,
    -0.1922,
    -0.9497,
    0.2503,
    -0.2921,
)
WAN21_LATENTS_STD = (
    2.8184,
    1.4541,
    2.3275,
    2.6558,
    1.2196,
    1.7708,
    2.6052,
    2.0743,
    3.2687,
    2.1526,
    2.8652,
    1.5579,
    1.6382,
    1.1253,
    2.8251,
    1.9160,
)
WAN22_LATENTS_MEAN = (
    -0.2289,
    -0.0052,
    -0.1323,
    -0.2339,
    -0.2799,
    0.0174,
    0.1838,
    0.1557,
    -0.1382,
    0.0542,
    0.2813,
    0.0891,
    0.1570,
    -0.0098,
    0.0375,
    -0.1825,
    -0.2246,
    -0.1207,
    -0.0698,
    0.5109,
    0.2665,
    -0.2108,
    -0.2158,
    0.2502,
    -0.2055,
    -0.0322,
    0.1109,
    0.1567,
    -0.0729,
    0.0899,
    -0.2799,
    -0.1230,
    -0.0313,
    -0.1649,
    0.0117,
    0.0723,
    -0.2839,
    -0.2083,
    -0.0520,
    0.3748,
    0.0152,
    0.1957,
    0.1433,
    -0.2944,
    0.3573,
    -0.0548,
    -0.1681,
    -0.0667,
)
WAN22_LATENTS_STD = (
    0.4765,
    1.0364,
    0.4514,
    1.1677,
    0.5313,
    0.4990,
    0.4818,
    0.5013,
    0.8158,
    1.0344,
    0.5894,
    1.0901,
    0.6885,
    0.6165,
    0.8454,
    0.4978,
    0.5759,
    0.3523,
    0.7135,
    0.6804,
    0.5833,
    1.4146,
    0.8986,
    0.5659,
    0.7069,
    0.5338,
    0.4889,
    0.4917,
    0.4069,
    0.4999,
    0.6866,
    0.4093,
    0.5709,
    0.6065,
    0.6415,
    0.4944,
    0.5726,
    1.2042,
    0.5458,
    1.6887,
    0.3971,
    1.0600,
    0.3943,
    0.5537,
    0.5444,
    0.4089,
    0.7468,
    0.7744,
)
LATENT_NORMALIZATION = {16: (WAN21_LATENTS_MEAN, WAN21_LATENTS_STD), 48: (WAN22_LATENTS_MEAN, WAN22_LATENTS_STD)}

TEMPORAL_STRIDE = 4  # every release: video frame 0 -> latent 0, frames 4k-3..4k -> latent k


# -- the original .pth layout ----------------------------------------------------------------------

# Wan's ResidualBlock is a Sequential (RMS_norm, SiLU, conv, RMS_norm, SiLU, Dropout, conv)
# plus a shortcut; diffusers names the parts.
_RESIDUAL_PARTS = (
    ("residual.0.", "norm1."),
    ("residual.2.", "conv1."),
    ("residual.3.", "norm2."),
    ("residual.6.", "conv2."),
    ("shortcut.", "conv_shortcut."),
)
_FIXED = (
    ("conv1.", "quant_conv."),
    ("conv2.", "post_quant_conv."),
    ("encoder.conv1.", "encoder.conv_in."),
    ("decoder.conv1.", "decoder.conv_in."),
    ("encoder.head.0.", "encoder.norm_out."),
    ("encoder.head.2.", "encoder.conv_out."),
    ("decoder.head.0.", "decoder.norm_out."),
    ("decoder.head.2.", "decoder.conv_out."),
    ("encoder.middle.0.", "encoder.mid_block.resnets.0."),
    ("encoder.middle.1.", "encoder.mid_block.attentions.0."),
    ("encoder.middle.2.", "encoder.mid_block.resnets.1."),
    ("decoder.middle.0.", "decoder.mid_block.resnets.0."),
    ("decoder.middle.1.", "decoder.mid_block.attentions.0."),
    ("decoder.middle.2.", "decoder.mid_block.resnets.1."),
)


def _residual_names(rest: str) -> str:
    for old, new in _RESIDUAL_PARTS:
        if rest.startswith(old):
            return new + rest[len(old) :]
    return rest


def _nested_level_key(key: str, block: str, inner: str, resampler: str, rest: str) -> str:
    """A Wan2.2 level's key (``<inner>.<i>.<part>`` of one level, ``block`` its diffusers
    name): the resampler's parts (``resample.``, ``time_conv.``) under ``resampler``, the
    residual blocks' under ``resnets.<i>``."""
    match = re.match(rf"{inner}\.(\d+)\.(.*)$", rest)
    if match is None:
        raise WeightsError(f"unexpected Wan2.2 VAE key {key!r}")
    j, part = match.groups()
    if part.startswith(("resample.", "time_conv.")):
        return f"{block}.{resampler}.{part}"
    return f"{block}.resnets.{j}.{_residual_names(part)}"


def diffusers_key(key: str, *, residual: bool, num_res_blocks: int) -> str:
    """An original Wan VAE key in diffusers' ``AutoencoderKLWan`` names.

    Wan2.1 (``residual`` false) keeps the encoder as one flat Sequential, indexed as
    diffusers' ``down_blocks``; its decoder's flat Sequential is levels of
    ``num_res_blocks + 1`` residual blocks and an upsampler, which diffusers groups
    (``up_blocks.<level>.resnets.<i>``, ``.upsamplers.0``). Wan2.2 (``residual``) nests
    both (``downsamples.<level>.downsamples.<i>``): residual blocks, then the resampler
    (``downsampler`` / ``upsampler``)."""
    for old, new in _FIXED:
        if key.startswith(old):
            rest = key[len(old) :]
            return new + (_residual_names(rest) if ".resnets." in new else rest)
    if match := re.match(r"encoder\.downsamples\.(\d+)\.(.*)$", key):
        index, rest = match.groups()
        if residual:
            return _nested_level_key(key, f"encoder.down_blocks.{index}", "downsamples", "downsampler", rest)
        return f"encoder.down_blocks.{index}.{_residual_names(rest)}"
    if match := re.match(r"decoder\.upsamples\.(\d+)\.(.*)$", key):
        index, rest = match.groups()
        if residual:
            return _nested_level_key(key, f"decoder.up_blocks.{index}", "upsamples", "upsampler", rest)
        level, position = divmod(int(index), num_res_blocks + 2)
        if position <= num_res_blocks:
            return f"decoder.up_blocks.{level}.resnets.{position}.{_residual_names(rest)}"
        return f"decoder.up_blocks.{level}.upsamplers.0.{rest}"
    raise WeightsError(f"unexpected Wan VAE key {key!r}")


def original_config(shapes: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """``AutoencoderKLWan``'s config for an original Wan VAE state dict, read from its
    tensors' names and shapes: z_dim, widths, levels, residual blocks, the temporal
    downsampling of each level, pixel patches; the latent normalization of the release
    with that z_dim."""
    try:
        z_dim = int(shapes["conv2.weight"][0])
        base_dim, in_channels = (int(x) for x in shapes["encoder.conv1.weight"][:2])
        out_channels, decoder_width = (int(x) for x in shapes["decoder.head.2.weight"][:2])
    except KeyError as exc:
        raise WeightsError(f"not a Wan VAE state dict (no {exc.args[0]!r})") from None
    residual = any(key.startswith("encoder.downsamples.0.downsamples.") for key in shapes)
    if any(".to_qkv." in key for key in shapes if ".downsamples." in key or ".upsamples." in key):
        raise WeightsError("Wan VAEs with attention inside the levels (attn_scales) are not supported")
    levels: list[dict[str, Any]] = []  # per encoder level: width, residual blocks, temporal downsampling
    if residual:
        for i in sorted({int(k.split(".")[2]) for k in shapes if k.startswith("encoder.downsamples.")}):
            prefix = f"encoder.downsamples.{i}.downsamples."
            blocks = sorted(
                {int(k[len(prefix) :].split(".")[0]) for k in shapes if k.startswith(prefix) and ".residual." in k}
            )
            levels.append(
                {
                    "width": int(shapes[f"{prefix}{blocks[0]}.residual.2.weight"][0]),
                    "blocks": len(blocks),
                    "temporal": any(k.startswith(prefix) and ".time_conv." in k for k in shapes),
                }
            )
    else:
        entries = sorted({int(k.split(".")[2]) for k in shapes if k.startswith("encoder.downsamples.")})
        current: dict[str, Any] = {"blocks": 0}
        for index in entries:
            prefix = f"encoder.downsamples.{index}."
            if f"{prefix}residual.2.weight" in shapes:
                current = {
                    **current,
                    "width": int(shapes[f"{prefix}residual.2.weight"][0]),
                    "blocks": current["blocks"] + 1,
                }
            else:  # a resampler closes the level
                levels.append({**current, "temporal": f"{prefix}time_conv.weight" in shapes})
                current = {"blocks": 0}
        levels.append({**current, "temporal": False})
    blocks = {level["blocks"] for level in levels}
    if len(blocks) != 1 or any(level["width"] % base_dim for level in levels):
        raise WeightsError("not a Wan VAE state dict (its levels differ in residual blocks or widths)")
    dim_mult = [level["width"] // base_dim for level in levels]
    patch = math.isqrt(in_channels // 3)
    if z_dim not in LATENT_NORMALIZATION:
        raise WeightsError(f"a Wan VAE with z_dim {z_dim}: no latent normalization is known (Wan2.1: 16, Wan2.2: 48)")
    mean, std = LATENT_NORMALIZATION[z_dim]
    config = {
        "base_dim": base_dim,
        "decoder_base_dim": decoder_width // dim_mult[0],
        "z_dim": z_dim,
        "dim_mult": dim_mult,
        "num_res_blocks": blocks.pop(),
        "attn_scales": [],
        "temperal_downsample": [level["temporal"] for level in levels[:-1]],
        "latents_mean": list(mean),
        "latents_std": list(std),
        "is_residual": residual,
        "in_channels": in_channels,
        "out_channels": out_channels,
        "patch_size": patch if patch > 1 else None,
        "scale_factor_temporal": 2 ** sum(level["temporal"] for level in levels[:-1]),
        "scale_factor_spatial": 2 ** (len(levels) - 1) * patch,
    }
    return config


def original_state_dict(state: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """An original Wan VAE state dict in diffusers' names (``diffusers_key``)."""
    return {
        diffusers_key(key, residual=config["is_residual"], num_res_blocks=config["num_res_blocks"]): value
        for key, value in state.items()
    }


# -- loading ---------------------------------------------------------------------------------------


def _read_original(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    import torch

    try:
        if path.suffix == ".safetensors":  # the original keys in safetensors (as ComfyUI ships the VAE)
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file: one line naming it
        raise WeightsError(f"{path}: cannot read a Wan VAE state dict ({str(exc).splitlines()[0][:160]})") from None
    if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
        state = state["state_dict"]
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path}: not a state dict of tensors")
    config = original_config({key: tuple(value.shape) for key, value in state.items()})
    return config, original_state_dict(state, config)


def _module(path: Path, dtype: torch.dtype):
    """diffusers' AutoencoderKLWan holding the weights at ``path``, in ``dtype`` on the CPU."""
    import torch
    from diffusers import AutoencoderKLWan

    if path.is_dir():
        if not (path / "config.json").is_file():
            raise WeightsError(f"{path}: a diffusers VAE folder holds config.json and the weights")
        module = AutoencoderKLWan.from_pretrained(path, torch_dtype=dtype)
        return module
    config, state = _read_original(path)
    with torch.device("meta"):
        module = AutoencoderKLWan(**config)
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        what = f"lacks {missing[:3]}" if missing else f"has unexpected {unexpected[:3]}"
        raise WeightsError(f"{path}: not a Wan VAE of its own shape ({what})")
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise WeightsError(f"{path}: {str(exc).splitlines()[-1].strip()[:200]}") from None
    # Weights stored in another precision (a half-precision copy) are cast as asked.
    return module if all(p.dtype == dtype for p in module.parameters()) else module.to(dtype)


def load_vae(path: str | Path, *, device: str = "cpu", dtype: str | torch.dtype = "float32") -> WanVAE:
    """The Wan VAE at ``path``: a diffusers ``vae/`` folder or an original ``.pth``."""
    import torch

    path = Path(path)
    if not path.exists():
        raise WeightsError(f"VAE {path} does not exist")
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    module = _module(path, dtype).to(device).eval().requires_grad_(False)
    return WanVAE(module)


# Peak device memory of a decode, in units of one latent frame's output at the decoder's
# last level (4 video frames x its width x its pixels, before 2x2 pixel patches unfold):
# measured on an H100 (benchmarks/vae_decode.py, docs/video.md) at about 7.7 + 7.0 k units
# for the Wan2.1 VAE and 10.8 + 12.3 k for the Wan2.2 VAE with k latent frames a call, in
# float32 and bfloat16 alike; this bound holds both.
DECODE_UNITS = 13


def decode_bytes(
    config: Mapping[str, Any], height: int, width: int, frames_per_call: int = 1, itemsize: int = 4
) -> int:
    """An upper bound on the device memory (beyond the weights) a decode takes at a latent
    grid of ``height`` x ``width`` with ``frames_per_call`` latent frames a decoder call:
    ``DECODE_UNITS`` x (calls' frames + 1) x one latent frame's output at the last level."""
    patch = int(config.get("patch_size") or 1)
    spatial = int(config.get("scale_factor_spatial") or 8)
    width_channels = int(config.get("decoder_base_dim") or config["base_dim"]) * int(config["dim_mult"][0])
    pixels = (height * spatial // patch) * (width * spatial // patch)
    unit = TEMPORAL_STRIDE * width_channels * pixels * itemsize
    return DECODE_UNITS * (frames_per_call + 1) * unit


class WanVAE:
    """diffusers' ``AutoencoderKLWan`` with the latent normalization, chunked decoding to
    uint8 frames and encoding of frames."""

    def __init__(self, module: Any) -> None:
        import torch

        self.module = module
        config = module.config
        self.z_dim = int(config.z_dim)
        self.patch_size = config.patch_size
        self.spatial_stride = int(config.scale_factor_spatial)
        self.temporal_stride = int(config.scale_factor_temporal)
        parameter = next(module.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        shape = (1, self.z_dim, 1, 1, 1)
        self.latents_mean = torch.tensor(config.latents_mean, dtype=torch.float32).view(shape).to(self.device)
        self.latents_std = torch.tensor(config.latents_std, dtype=torch.float32).view(shape).to(self.device)

    @property
    def config(self) -> Mapping[str, Any]:
        return dict(self.module.config)

    def _latents(self, latents: torch.Tensor | np.ndarray) -> torch.Tensor:
        import torch

        latents = torch.as_tensor(latents)
        if latents.ndim == 4:  # [C, F, H, W], as the extraction keeps them
            latents = latents[None]
        if latents.ndim != 5 or latents.shape[:2] != (1, self.z_dim):
            raise ValueError(f"latents are [1, {self.z_dim}, F, H, W]; got {list(latents.shape)}")
        return latents.to(self.device, torch.float32)

    def frames_per_call(self, latents_shape: Sequence[int], memory_budget: int | None) -> int:
        """Latent frames one decoder call takes within ``memory_budget`` bytes (at least 1)."""
        if memory_budget is None:
            return 1
        height, width = latents_shape[-2:]
        itemsize = self.latents_mean.new_empty((), dtype=self.dtype).element_size()
        frames = 1
        while (
            frames < latents_shape[-3] - 1
            and decode_bytes(self.config, height, width, frames + 1, itemsize) <= memory_budget
        ):
            frames += 1
        return frames

    def decode_pixels(
        self, latents: torch.Tensor | np.ndarray, *, frames_per_call: int = 1, to_uint8: bool = False
    ) -> torch.Tensor:
        """Normalized latents [1, C, F, H, W] (or [C, F, H, W]) -> the video [1, 3, T, H', W']
        in [-1, 1] (or uint8 [T, H', W', 3] on the host with ``to_uint8``); latent frame 0
        alone, then ``frames_per_call`` latent frames a call."""
        return self.pixel_stream().push(latents, frames_per_call=frames_per_call, to_uint8=to_uint8)

    def pixel_stream(self) -> PixelStream:
        """A decode of one video whose latents arrive in pieces (:class:`PixelStream`)."""
        return PixelStream(self)

    def decode(
        self,
        latents: torch.Tensor | np.ndarray,
        *,
        frames_per_call: int | None = None,
        memory_budget: int | None = None,
    ) -> torch.Tensor:
        """Normalized latents [1, C, F, H, W] (or [C, F, H, W]) -> uint8 frames [T, H', W', 3]
        on the host, T = 4 (F - 1) + 1; decoded in calls of ``frames_per_call`` latent frames
        (default: as many as ``memory_budget`` bytes allow, 1 without a budget)."""
        per_call = frames_per_call or self.frames_per_call(tuple(latents.shape), memory_budget)
        return self.decode_pixels(latents, frames_per_call=per_call, to_uint8=True)

    def encode(self, frames: torch.Tensor | np.ndarray, *, groups_per_call: int = 1) -> torch.Tensor:
        """Video frames -> normalized latents [1, C, F, H/s, W/s] (the posterior's mean).

        ``frames``: uint8 [T, H, W, 3], or float [1, 3, T, H, W] in [-1, 1]; T = 4 k + 1.
        Pixel frame 0 alone, then ``groups_per_call`` groups of 4 frames a call."""
        import torch
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, patchify

        x = torch.as_tensor(frames)
        if x.dtype == torch.uint8:
            if x.ndim != 4 or x.shape[-1] != 3:
                raise ValueError(f"uint8 frames are [T, H, W, 3]; got {list(x.shape)}")
            x = x.permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
        if x.ndim != 5 or x.shape[1] != 3:
            raise ValueError(f"frames are [1, 3, T, H, W]; got {list(x.shape)}")
        count = x.shape[2]
        if (count - 1) % TEMPORAL_STRIDE:
            raise ValueError(f"the Wan VAE encodes 4 k + 1 frames; got {count}")
        module = self.module
        x = x.to(self.device, self.dtype)
        if self.patch_size is not None:
            x = patchify(x, patch_size=self.patch_size)
        step = TEMPORAL_STRIDE * max(1, groups_per_call)
        spans = [(0, 1)] + [(a, min(a + step, count)) for a in range(1, count, step)]
        cache: list[Any] = [None] * sum(isinstance(m, WanCausalConv3d) for m in module.encoder.modules())
        with torch.inference_mode():
            out = torch.cat([module.encoder(x[:, :, a:b], feat_cache=cache, feat_idx=[0]) for a, b in spans], dim=2)
            mu = module.quant_conv(out)[:, : self.z_dim].float()
        return (mu - self.latents_mean) / self.latents_std


class PixelStream:
    """One video decoded as its latents arrive: each :meth:`push` decodes the next latent
    frames with the decoder's causal-convolution cache of the earlier ones, so every latent
    is decoded once and the pieces' frames are those of one decode of the whole video
    (latent frame 0 alone, then ``frames_per_call`` a call, as :meth:`WanVAE.decode_pixels`)
    within float rounding: the 1x1x1 post-quant convolution rounds a piece by an ulp unlike
    the whole.
    Krea's re-encode needs the last frame of a growing prefix at every block: decoding the
    prefix again each time would cost the square of the video's length."""

    def __init__(self, vae: WanVAE) -> None:
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

        self.vae = vae
        self.latent_frames = 0  # pushed so far
        self._cache: list[Any] = [None] * sum(isinstance(m, WanCausalConv3d) for m in vae.module.decoder.modules())

    def push(
        self, latents: torch.Tensor | np.ndarray, *, frames_per_call: int = 1, to_uint8: bool = False
    ) -> torch.Tensor:
        """The next normalized latents [1, C, F, H, W] (or [C, F, H, W]) -> their video frames
        [1, 3, T, H', W'] in [-1, 1] (or uint8 [T, H', W', 3] on the host): T = 4 F, plus 1
        more for the video's first latent frame."""
        import torch
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        vae, module = self.vae, self.vae.module
        z = vae._latents(latents) * vae.latents_std + vae.latents_mean
        count, step = z.shape[-3], max(1, frames_per_call)
        begin = 1 if self.latent_frames == 0 and count else 0
        spans = [(0, 1)] * begin + [(a, min(a + step, count)) for a in range(begin, count, step)]
        parts = []
        with torch.inference_mode():
            x = module.post_quant_conv(z.to(vae.dtype))
            for start, stop in spans:
                first = self.latent_frames == 0
                out = module.decoder(x[:, :, start:stop], feat_cache=self._cache, feat_idx=[0], first_chunk=first)
                self.latent_frames += stop - start
                if vae.patch_size is not None:
                    out = unpatchify(out, patch_size=vae.patch_size)
                out = out.clamp(-1.0, 1.0)
                parts.append(_uint8_frames(out) if to_uint8 else out)
        return torch.cat(parts, dim=0 if to_uint8 else 2)


def _uint8_frames(video: torch.Tensor) -> torch.Tensor:
    """[1, 3, T, H, W] in [-1, 1] -> uint8 [T, H, W, 3] on the host (rounded to nearest)."""
    import torch

    pixels = ((video[0].float() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return pixels.permute(1, 2, 3, 0).contiguous().cpu()

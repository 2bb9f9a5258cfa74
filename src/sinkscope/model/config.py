"""Named model configs of the Wan2.1 transformer family."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WanConfig:
    """Sizes of a Wan2.1 text-to-video transformer.

    Field names follow the original Wan ``config.json`` (``dim``, ``ffn_dim``, ...).
    ``latent_height``/``latent_width`` are the default latent grid (pixels / 8; / 16 for
    Wan2.2-TI2V-5B's VAE);
    a generation may override them.
    """

    dim: int = 1536
    ffn_dim: int = 8960
    num_heads: int = 12
    num_layers: int = 30
    in_dim: int = 16
    out_dim: int = 16
    text_dim: int = 4096
    text_len: int = 512
    freq_dim: int = 256
    patch_size: tuple[int, int, int] = (1, 2, 2)
    eps: float = 1e-6
    qk_norm: bool = True
    cross_attn_norm: bool = True
    rope_max_positions: int = 1024
    latent_height: int = 60
    latent_width: int = 104

    def __post_init__(self) -> None:
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 2 or self.head_dim < 6:
            raise ValueError(f"head_dim {self.head_dim} must be even and at least 6 for the 3-axis RoPE")
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def frame_seq_length(self, latent_height: int | None = None, latent_width: int | None = None) -> int:
        """Tokens per latent frame for a latent grid (default: this config's grid)."""
        height = self.latent_height if latent_height is None else latent_height
        width = self.latent_width if latent_width is None else latent_width
        _, ph, pw = self.patch_size
        if height % ph or width % pw:
            raise ValueError(f"latent grid {height}x{width} is not divisible by the patch size {ph}x{pw}")
        return (height // ph) * (width // pw)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["patch_size"] = list(self.patch_size)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WanConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


MODEL_CONFIGS: dict[str, WanConfig] = {
    # Wan-AI/Wan2.1-T2V-1.3B, the base of Self-Forcing. 480x832 -> 60x104 latents, 1560 tokens a frame.
    "wan2.1-t2v-1.3b": WanConfig(),
    # Wan-AI/Wan2.1-T2V-14B (the DMD teacher of Self-Forcing).
    "wan2.1-t2v-14b": WanConfig(dim=5120, ffn_dim=13824, num_heads=40, num_layers=40),
    # Wan-AI/Wan2.2-TI2V-5B, the base of LongLive 2.0: 48 latent channels (the Wan2.2 VAE's
    # z_dim, stride 4x16x16), so 704x1280 video -> 44x80 latents, 880 tokens a frame, 24 fps.
    # Its block is Wan2.1's (RoPE split 44/42/42 of head_dim 128, as the 3-axis formula gives).
    "wan2.2-ti2v-5b": WanConfig(
        dim=3072, ffn_dim=14336, num_heads=24, num_layers=30, in_dim=48, out_dim=48, latent_height=44, latent_width=80
    ),
    # The embedded demo: the same architecture, 12 heads (so L5H10 exists), 6 layers,
    # 16-wide heads and 4x6 = 24 tokens a frame, so a whole study runs on a CPU in seconds.
    "demo": WanConfig(
        dim=192,
        ffn_dim=512,
        num_heads=12,
        num_layers=6,
        text_dim=64,
        text_len=32,
        freq_dim=64,
        latent_height=8,
        latent_width=12,
    ),
}


def get_model_config(name_or_config: str | WanConfig | Mapping[str, Any]) -> WanConfig:
    """Resolve a named config, a mapping of fields, or a config object."""
    if isinstance(name_or_config, WanConfig):
        return name_or_config
    if isinstance(name_or_config, Mapping):
        return WanConfig.from_dict(name_or_config)
    try:
        return MODEL_CONFIGS[name_or_config]
    except KeyError:
        known = ", ".join(sorted(MODEL_CONFIGS))
        raise KeyError(f"unknown model config {name_or_config!r}; known: {known}") from None


def parameter_shapes(config: WanConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the transformer's state dict and its shape, in Wan's original names,
    without torch (the config check compares weight files against it; a test compares it
    with the model's own state dict)."""
    d, f, patch = config.dim, config.ffn_dim, math.prod(config.patch_size)
    shapes: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (d, config.in_dim, *config.patch_size),
        "patch_embedding.bias": (d,),
        "text_embedding.0.weight": (d, config.text_dim),
        "text_embedding.0.bias": (d,),
        "text_embedding.2.weight": (d, d),
        "text_embedding.2.bias": (d,),
        "time_embedding.0.weight": (d, config.freq_dim),
        "time_embedding.0.bias": (d,),
        "time_embedding.2.weight": (d, d),
        "time_embedding.2.bias": (d,),
        "time_projection.1.weight": (6 * d, d),
        "time_projection.1.bias": (6 * d,),
    }
    for i in range(config.num_layers):
        block = f"blocks.{i}"
        shapes[f"{block}.modulation"] = (1, 6, d)
        for attention in ("self_attn", "cross_attn"):
            for projection in "qkvo":
                shapes[f"{block}.{attention}.{projection}.weight"] = (d, d)
                shapes[f"{block}.{attention}.{projection}.bias"] = (d,)
            if config.qk_norm:
                shapes[f"{block}.{attention}.norm_q.weight"] = (d,)
                shapes[f"{block}.{attention}.norm_k.weight"] = (d,)
        if config.cross_attn_norm:
            shapes[f"{block}.norm3.weight"] = (d,)
            shapes[f"{block}.norm3.bias"] = (d,)
        shapes |= {
            f"{block}.ffn.0.weight": (f, d),
            f"{block}.ffn.0.bias": (f,),
            f"{block}.ffn.2.weight": (d, f),
            f"{block}.ffn.2.bias": (d,),
        }
    shapes |= {
        "head.modulation": (1, 2, d),
        "head.head.weight": (patch * config.out_dim, d),
        "head.head.bias": (patch * config.out_dim,),
    }
    return shapes

"""Weight formats: one object per format, found by name, used by the check and by loading.

A format is a ``WeightFormat`` subclass registered with ``@register``. It answers, for
the weights at a path:

- ``detect``: whether they are this format (``format: auto``);
- ``files``: which files hold the tensors (failing when the path is not this format's
  layout); their bytes are the checkpoint's digest;
- ``folder_config``: the model config a folder of this format declares (config.json);
- ``check``: whether they are whole and hold exactly the model's tensors, read from
  headers and the pickle's structure without torch (``sinkscope check``, the Snakefile);
- ``read``: the state dict in the model's (Wan's original) key names; torch is
  imported when this is called (``build``: the model itself, for weights made rather
  than read).

``sinkscope.model.checkpoints`` resolves a config entry through ``check``,
``sinkscope.model.loading`` loads through ``read``: each format is read by one piece of
code. The schema's ``format`` enum is ``auto`` plus the names registered here (a test
checks it).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sinkscope.errors import WeightsError
from sinkscope.model.config import MODEL_CONFIGS, WanConfig, parameter_shapes
from sinkscope.model.weightfiles import (
    TORCH_SUFFIXES,
    check_shapes,
    check_torch_file,
    folder_weight_files,
    load_safetensors,
    read_json,
    safetensors_header,
    safetensors_shapes,
    strip_wrappers,
    torch_load,
    transformer_folder,
)

if TYPE_CHECKING:
    import torch

    from sinkscope.model.wan import WanModel

__all__ = ["WEIGHT_FORMATS", "WeightFormat", "WeightOptions", "detect_format", "register", "weight_format"]


@dataclass(frozen=True)
class WeightOptions:
    """A checkpoint entry's settings for reading its weights."""

    ema: bool = True  # Self-Forcing: generator_ema (true) or generator (false)
    allow_pickle: bool = False  # unpickle objects beyond tensors (only for trusted files)
    seed: int = 0  # the demo's random weights


class WeightFormat:
    """One weights format. Subclasses set ``name`` and ``summary`` and implement the
    methods below; ``@register`` makes the format known by its name."""

    name: ClassVar[str]
    summary: ClassVar[str]  # what the weights are, a few words
    takes_file: ClassVar[bool] = True
    default_model: ClassVar[str | None] = None  # the model config when the entry names none

    def detect(self, path: Path) -> bool:
        """Whether the existing ``path`` holds weights of this format."""
        return False

    def files(self, path: Path) -> list[Path]:
        """The files holding the tensors; fails when ``path`` is not laid out as this format's."""
        raise NotImplementedError

    def digest_files(self, path: Path) -> list[Path]:
        """The files whose bytes are the weights: the tensors' files, and a folder's config and index."""
        files = self.files(path)
        if path.is_dir():
            folder = transformer_folder(path)
            files += [f for f in (folder / "config.json", *folder.glob("*.safetensors.index.json")) if f.is_file()]
        return sorted(files)

    def folder_config(self, folder: Path) -> WanConfig | None:
        """The model config a folder of this format declares, or None."""
        return None

    def check(self, path: Path, config: WanConfig, options: WeightOptions) -> None:
        """Raise WeightsError unless the weights are whole and fit ``config`` (no torch)."""
        raise NotImplementedError

    def read(self, path: Path | None, config: WanConfig, options: WeightOptions) -> dict[str, torch.Tensor]:
        """The state dict in the model's key names (not yet checked against the model)."""
        raise NotImplementedError

    def build(self, config: WanConfig, options: WeightOptions) -> WanModel | None:
        """The model itself, float32 on the CPU, for weights made rather than read (the
        demo's); None: loading reads the state dict into a model built on the meta device."""
        return None


WEIGHT_FORMATS: dict[str, WeightFormat] = {}


def register(cls: type[WeightFormat]) -> type[WeightFormat]:
    """Make the format ``cls`` known by its name (a class decorator)."""
    WEIGHT_FORMATS[cls.name] = cls()
    return cls


def weight_format(name: str) -> WeightFormat:
    """The registered format ``name``; ``auto`` is not a format (see ``detect_format``)."""
    if name not in WEIGHT_FORMATS:
        raise WeightsError(f"format {name!r} is not one of auto, {', '.join(WEIGHT_FORMATS)}")
    return WEIGHT_FORMATS[name]


def detect_format(path: str | Path) -> str:
    """The name of the format of the weights at ``path``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"weights path {str(path)!r} does not exist")
    found = next((name for name, fmt in WEIGHT_FORMATS.items() if fmt.detect(path)), None)
    if found is None:
        known = "; ".join(f"{name}: {fmt.summary}" for name, fmt in WEIGHT_FORMATS.items() if fmt.takes_file)
        raise WeightsError(f"cannot tell the format of {path} (known formats: {known})")
    return found


# -- demo: seeded random weights ---------------------------------------------------------------


@register
class DemoFormat(WeightFormat):
    name = "demo"
    summary = "seeded random weights"
    takes_file = False
    default_model = "demo"

    def files(self, path: Path) -> list[Path]:
        return []

    def check(self, path: Path, config: WanConfig, options: WeightOptions) -> None:
        return None

    def read(self, path: Path | None, config: WanConfig, options: WeightOptions) -> dict[str, torch.Tensor]:
        return self.build(config, options).state_dict()

    def build(self, config: WanConfig, options: WeightOptions) -> WanModel:
        from sinkscope.model.wan import build_model

        return build_model(config, seed=options.seed)


# -- self_forcing: a training checkpoint .pt ---------------------------------------------------


def generator_state(data: Any, path: Path, ema: bool, is_state_dict: Callable[[Any], bool]) -> dict[str, Any]:
    """The generator's state dict in a Self-Forcing checkpoint's top-level dict (or the
    dict itself when it is a bare state dict), wrapper prefixes gone. ``data`` is what
    torch.load returns, or ``torchfile``'s stand-in structure: ``is_state_dict`` tells."""
    if not isinstance(data, Mapping):
        raise WeightsError(f"{path} holds a {type(data).__name__}, not a dict of state dicts")
    wanted = "generator_ema" if ema else "generator"
    present = [key for key in ("generator", "generator_ema") if key in data]
    wrapped = data.get("model") if isinstance(data.get("model"), Mapping) else None
    if wanted in data:
        state = data[wanted]
        if not is_state_dict(state):
            raise WeightsError(f"{path}: {wanted!r} is not a state dict of tensors")
    elif present:
        option = "ema: false" if ema else "ema: true"
        raise WeightsError(f"{path} has no {wanted!r} (it has {present}); set {option} to load the other")
    elif wrapped is not None and is_state_dict(wrapped):
        state = wrapped  # LongLive 2.0's loader takes a "model" entry when there is no generator
    elif is_state_dict(data):
        state = data
    else:
        keys = ", ".join(map(str, list(data)[:8]))
        raise WeightsError(f"{path} has none of 'generator_ema', 'generator', 'model' (keys: {keys})")
    # FSDP's wrapper names, which Causal Forcing's inference.py also removes on load.
    return strip_wrappers(state)


def _is_tensor_dict(value: Any) -> bool:
    import torch

    return isinstance(value, Mapping) and all(isinstance(v, torch.Tensor) for v in value.values())


@register
class SelfForcingFormat(WeightFormat):
    """A Self-Forcing ``.pt``: the state dict under ``generator_ema`` (or ``generator``),
    keys prefixed ``model.``; a bare state dict works too. LongLive 2.0's ``model_bf16.pt``
    is this layout as well (``generator``, ``generator_ema`` with FSDP's wrapper names, or
    ``model``; their loader's order)."""

    name = "self_forcing"
    summary = ".pt with generator_ema / generator / model"

    def detect(self, path: Path) -> bool:
        return path.is_file() and path.suffix in TORCH_SUFFIXES

    def files(self, path: Path) -> list[Path]:
        if path.is_dir():
            raise WeightsError(f"format 'self_forcing' expects a .pt file, got the folder {path}")
        check_torch_file(path)
        return [path]

    def check(self, path: Path, config: WanConfig, options: WeightOptions) -> None:
        from sinkscope.model.torchfile import read_trusted_structure, tensor_shapes

        [path] = self.files(path)
        data = read_trusted_structure(path, allow_pickle=options.allow_pickle)
        state = generator_state(data, path, options.ema, lambda value: tensor_shapes(value) is not None)
        check_shapes(tensor_shapes(state), parameter_shapes(config), str(path))

    def read(self, path: Path | None, config: WanConfig, options: WeightOptions) -> dict[str, torch.Tensor]:
        [path] = self.files(path)
        data = torch_load(path, allow_pickle=options.allow_pickle)
        return generator_state(data, path, options.ema, _is_tensor_dict)


# -- wan and diffusers: safetensors with a config.json ------------------------------------------


def _is_diffusers_config(data: Mapping[str, Any]) -> bool:
    return data.get("_class_name") == "WanTransformer3DModel" or "num_attention_heads" in data


def _safetensors_layout(path: Path) -> str | None:
    """'diffusers' or 'wan' for a .safetensors file or a folder; None for anything else."""
    if path.is_file():
        if path.suffix != ".safetensors":
            return None
        keys = safetensors_header(path)
        return "diffusers" if any(k.startswith("condition_embedder.") for k in keys) else "wan"
    folder = transformer_folder(path)
    config_path = folder / "config.json"
    if config_path.is_file():
        config = read_json(config_path)
        if _is_diffusers_config(config):
            return "diffusers"
        if config.get("_class_name") == "WanModel" or "dim" in config:
            return "wan"
    keys = safetensors_header(folder_weight_files(folder)[0])
    return "diffusers" if any(k.startswith(("condition_embedder.", "blocks.0.attn1")) for k in keys) else "wan"


class SafetensorsFormat(WeightFormat):
    """A folder of safetensors shards (or one .safetensors file) whose keys ``model_names``
    turns into the model's."""

    def detect(self, path: Path) -> bool:
        return _safetensors_layout(path) == self.name

    def model_names(self, state: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def files(self, path: Path) -> list[Path]:
        if path.is_dir():
            return folder_weight_files(transformer_folder(path))
        if path.suffix != ".safetensors":
            raise WeightsError(f"format {self.name!r} expects a folder or .safetensors file, got {path}")
        return [path]

    def check(self, path: Path, config: WanConfig, options: WeightOptions) -> None:
        files = self.files(path)
        found = self.model_names(safetensors_shapes(files))
        check_shapes(
            found, parameter_shapes(config), str(files[0]) if len(files) == 1 else f"the weights in {files[0].parent}"
        )

    def read(self, path: Path | None, config: WanConfig, options: WeightOptions) -> dict[str, torch.Tensor]:
        return self.model_names(load_safetensors(self.files(path)))


@register
class WanFormat(SafetensorsFormat):
    """The Wan2.1 release folder (``config.json`` + ``diffusion_pytorch_model.safetensors``,
    sharded with an ``.index.json`` or not), or a single original-format ``.safetensors``
    (ComfyUI's ``model.diffusion_model.`` prefix is dropped, and a training wrapper's
    ``model.``: Krea Realtime 14B's ``krea-realtime-video-14b.safetensors`` is a flat dict of
    ``model.blocks.0.self_attn.k.weight``...)."""

    name = "wan"
    summary = "original Wan release folder or .safetensors"

    def model_names(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return strip_wrappers(state, ("model.diffusion_model.", "model."))

    def folder_config(self, folder: Path) -> WanConfig | None:
        folder = transformer_folder(folder)
        config_path = folder / "config.json"
        if not config_path.is_file() or _is_diffusers_config(data := read_json(config_path)):
            return None
        config = config_from_wan_json(data)
        if "text_dim" not in data:
            # Wan's config.json leaves text_dim out; the weights' header knows it.
            width = _peek_shape(folder, "text_embedding.0.weight")
            if width is not None:
                config = dataclasses.replace(config, text_dim=width[1])
        return config


def config_from_wan_json(data: Mapping[str, Any]) -> WanConfig:
    """WanConfig from an original Wan ``config.json`` (WanModel fields)."""
    keys = (
        "dim",
        "ffn_dim",
        "num_heads",
        "num_layers",
        "in_dim",
        "out_dim",
        "text_len",
        "freq_dim",
        "eps",
        "text_dim",
        "qk_norm",
        "cross_attn_norm",
    )
    fields = {k: data[k] for k in keys if k in data}
    if "patch_size" in data:
        fields["patch_size"] = tuple(data["patch_size"])
    if data.get("model_type", "t2v") not in ("t2v", "ti2v"):
        raise WeightsError(
            f"model_type {data.get('model_type')!r} is not supported (text-to-video 't2v', or "
            "Wan2.2's 'ti2v' as LongLive 2.0 runs it)"
        )
    config = WanConfig(**fields)
    # A named model of the same sizes gives its latent grid (Wan2.2-TI2V-5B: 44x80, not 60x104).
    grid = ("latent_height", "latent_width")
    sizes = {k: v for k, v in config.to_dict().items() if k not in grid}
    named = next(
        (c for c in MODEL_CONFIGS.values() if {k: v for k, v in c.to_dict().items() if k not in grid} == sizes), None
    )
    return (
        config
        if named is None
        else dataclasses.replace(config, latent_height=named.latent_height, latent_width=named.latent_width)
    )


def _peek_shape(folder: Path, key: str) -> tuple[int, ...] | None:
    try:
        files = folder_weight_files(folder)
    except FileNotFoundError:
        return None
    for file in files:
        entry = safetensors_header(file).get(key)
        if entry is not None:
            return tuple(entry["shape"])
    return None


@register
class DiffusersFormat(SafetensorsFormat):
    """A diffusers ``WanTransformer3DModel`` folder (or a pipeline folder with ``transformer/``)."""

    name = "diffusers"
    summary = "WanTransformer3DModel folder"

    def model_names(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return {diffusers_to_wan_key(k): v for k, v in state.items() if not k.startswith("rope.")}

    def folder_config(self, folder: Path) -> WanConfig | None:
        config_path = transformer_folder(folder) / "config.json"
        if not config_path.is_file() or not _is_diffusers_config(data := read_json(config_path)):
            return None
        return config_from_diffusers_json(data)


def config_from_diffusers_json(data: Mapping[str, Any]) -> WanConfig:
    """WanConfig from a diffusers ``WanTransformer3DModel`` config.json."""
    if data.get("image_dim") or data.get("added_kv_proj_dim"):
        raise WeightsError("image-conditioned (i2v) Wan transformers are not supported; use a t2v checkpoint")
    qk_norm = data.get("qk_norm", "rms_norm_across_heads")
    if qk_norm not in (None, "rms_norm_across_heads"):
        raise WeightsError(f"qk_norm {qk_norm!r} is not Wan's RMSNorm across heads")
    return WanConfig(
        dim=data["num_attention_heads"] * data["attention_head_dim"],
        ffn_dim=data["ffn_dim"],
        num_heads=data["num_attention_heads"],
        num_layers=data["num_layers"],
        in_dim=data.get("in_channels", 16),
        out_dim=data.get("out_channels", 16),
        text_dim=data.get("text_dim", 4096),
        freq_dim=data.get("freq_dim", 256),
        patch_size=tuple(data.get("patch_size", (1, 2, 2))),
        eps=data.get("eps", 1e-6),
        qk_norm=qk_norm is not None,
        cross_attn_norm=data.get("cross_attn_norm", True),
        rope_max_positions=data.get("rope_max_seq_len", 1024),
    )


_DIFFUSERS_TO_WAN = [
    (r"^condition_embedder\.time_embedder\.linear_1\.", "time_embedding.0."),
    (r"^condition_embedder\.time_embedder\.linear_2\.", "time_embedding.2."),
    (r"^condition_embedder\.text_embedder\.linear_1\.", "text_embedding.0."),
    (r"^condition_embedder\.text_embedder\.linear_2\.", "text_embedding.2."),
    (r"^condition_embedder\.time_proj\.", "time_projection.1."),
    (r"^scale_shift_table$", "head.modulation"),
    (r"^proj_out\.", "head.head."),
    (r"^(blocks\.\d+)\.scale_shift_table$", r"\1.modulation"),
    (r"^(blocks\.\d+)\.attn1\.", r"\1.self_attn."),
    (r"^(blocks\.\d+)\.attn2\.", r"\1.cross_attn."),
    # diffusers' norm2 is the affine norm before cross-attention, Wan's norm3.
    (r"^(blocks\.\d+)\.norm2\.", r"\1.norm3."),
    (r"^(blocks\.\d+)\.ffn\.net\.0\.proj\.", r"\1.ffn.0."),
    (r"^(blocks\.\d+)\.ffn\.net\.2\.", r"\1.ffn.2."),
    (r"\.to_q\.", ".q."),
    (r"\.to_k\.", ".k."),
    (r"\.to_v\.", ".v."),
    (r"\.to_out\.0\.", ".o."),
]


def diffusers_to_wan_key(key: str) -> str:
    """A diffusers WanTransformer3DModel key in Wan's original names."""
    for pattern, replacement in _DIFFUSERS_TO_WAN:
        key = re.sub(pattern, replacement, key)
    return key


def config_in_folder(folder: Path) -> WanConfig | None:
    """The model config a weights folder declares (config.json) in any format, or None."""
    return next((config for fmt in WEIGHT_FORMATS.values() if (config := fmt.folder_config(folder)) is not None), None)

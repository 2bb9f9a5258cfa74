"""Loading transformer weights: Wan release folders, Self-Forcing .pt, diffusers folders.

Formats (detected, or forced by a checkpoint's ``format``):

- ``wan``: the Wan2.1 release folder (``config.json`` + ``diffusion_pytorch_model.safetensors``,
  sharded with an ``.index.json`` or not), or a single original-format ``.safetensors``;
- ``self_forcing``: a Self-Forcing ``.pt`` whose state dict sits under ``generator_ema``
  (or ``generator``), keys prefixed ``model.``;
- ``diffusers``: a ``WanTransformer3DModel`` folder (or a pipeline folder with
  ``transformer/``), names mapped to the original ones;
- ``demo``: no file; seeded random weights of a named config.

Loading is strict (missing/unexpected keys and shape mismatches fail, with counts and
the first names), safe (``torch.load(weights_only=True)`` unless ``allow_pickle``) and
lazy where the format allows (safetensors and ``.pt`` files are memory-mapped, and the
model is built on the meta device, so the weights are never copied twice).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .config import WanConfig, get_model_config
from .wan import WanModel, build_model

if TYPE_CHECKING:
    from ..config import CheckpointSpec

WAN_WEIGHTS = "diffusion_pytorch_model.safetensors"
WAN_INDEX = "diffusion_pytorch_model.safetensors.index.json"
TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class WeightsError(ValueError):
    """Weights that do not fit the model: the message names the file and the keys."""


# -- formats and configs --------------------------------------------------------------


def _read_json(path: Path) -> dict:
    try:
        with open(path) as handle:
            return json.load(handle)
    except json.JSONDecodeError as exc:
        raise WeightsError(f"{path}: not valid JSON ({exc})") from None


def _transformer_folder(path: Path) -> Path:
    """A diffusers pipeline folder keeps the transformer under transformer/."""
    sub = path / "transformer"
    return sub if (sub / "config.json").is_file() else path


def _safe_open(path: Path, **options):
    """safetensors' safe_open, with a corrupt or truncated file named in a WeightsError."""
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="pt", **options)
    except Exception as exc:  # noqa: BLE001 - SafetensorError is not a common base class
        raise WeightsError(f"{path} is not a readable .safetensors file (corrupt or truncated?): {exc}") from None


def _safetensors_keys(path: Path) -> list[str]:
    with _safe_open(path) as handle:
        return list(handle.keys())


def _folder_weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder, in the order an index names them."""
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        weight_map = _read_json(indexes[0]).get("weight_map", {})
        files = sorted({folder / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{indexes[0]} names shards that do not exist: {', '.join(missing[:3])}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in folder {folder}")
    return files


def detect_format(path: str | Path) -> str:
    """'wan', 'self_forcing' or 'diffusers', from the files at ``path``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"weights path {str(path)!r} does not exist")
    if path.is_file():
        if path.suffix in TORCH_SUFFIXES:
            return "self_forcing"
        if path.suffix == ".safetensors":
            keys = _safetensors_keys(path)
            return "diffusers" if any(k.startswith("condition_embedder.") for k in keys) else "wan"
        raise WeightsError(f"cannot tell the format of {path}: expected a folder, .safetensors or .pt")
    folder = _transformer_folder(path)
    config_path = folder / "config.json"
    if config_path.is_file():
        config = _read_json(config_path)
        if config.get("_class_name") == "WanTransformer3DModel" or "num_attention_heads" in config:
            return "diffusers"
        if config.get("_class_name") == "WanModel" or "dim" in config:
            return "wan"
    files = _folder_weight_files(folder)
    keys = _safetensors_keys(files[0])
    return "diffusers" if any(k.startswith(("condition_embedder.", "blocks.0.attn1")) for k in keys) else "wan"


def config_from_wan_json(data: Mapping[str, Any]) -> WanConfig:
    """WanConfig from an original Wan ``config.json`` (WanModel fields)."""
    fields = {k: data[k] for k in ("dim", "ffn_dim", "num_heads", "num_layers", "in_dim", "out_dim", "text_len", "freq_dim", "eps", "text_dim", "qk_norm", "cross_attn_norm") if k in data}
    if "patch_size" in data:
        fields["patch_size"] = tuple(data["patch_size"])
    if data.get("model_type", "t2v") != "t2v":
        raise WeightsError(f"model_type {data.get('model_type')!r} is not supported (text-to-video 't2v' only)")
    return WanConfig(**fields)


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


def _config_in_folder(folder: Path) -> WanConfig | None:
    folder = _transformer_folder(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        return None
    data = _read_json(config_path)
    if data.get("_class_name") == "WanTransformer3DModel" or "num_attention_heads" in data:
        return config_from_diffusers_json(data)
    config = config_from_wan_json(data)
    if "text_dim" not in data:
        # Wan's config.json leaves text_dim out; the weights' header knows it.
        width = _peek_shape(folder, "text_embedding.0.weight")
        if width is not None:
            config = dataclasses.replace(config, text_dim=width[1])
    return config


def _peek_shape(folder: Path, key: str) -> tuple[int, ...] | None:
    """A tensor's shape from safetensors headers, without reading the data."""
    try:
        files = _folder_weight_files(folder)
    except FileNotFoundError:
        return None
    for file in files:
        with _safe_open(file) as handle:
            if key in handle.keys():
                return tuple(handle.get_slice(key).get_shape())
    return None


def _resolve(path: str | None, base_dir: Path) -> Path | None:
    if path is None:
        return None
    p = Path(path).expanduser()
    return p if p.is_absolute() else base_dir / p


def resolve_model_config(spec: "CheckpointSpec", base_dir: str | Path = ".") -> WanConfig:
    """The model config of a checkpoint entry: named, or read from its config.json.

    Also checks that the files the entry names exist, so a config fails before any job.
    """
    base_dir = Path(base_dir)
    if spec.format == "demo":
        if spec.weights:
            raise WeightsError("format 'demo' takes no weights file (it builds seeded random weights)")
        return get_model_config(spec.model or "demo")
    weights = _resolve(spec.weights, base_dir)
    if weights is None:
        raise WeightsError(f"format {spec.format!r} needs 'weights' (a file or folder)")
    if not weights.exists():
        raise FileNotFoundError(f"weights {spec.weights!r} do not exist (looked at {weights})")
    base = _resolve(spec.base, base_dir)
    if base is not None and not base.is_dir():
        raise FileNotFoundError(f"base folder {spec.base!r} does not exist (looked at {base})")
    fmt = detect_format(weights) if spec.format == "auto" else spec.format
    if spec.model:
        return get_model_config(spec.model)
    for folder in ([weights] if weights.is_dir() else []) + ([base] if base is not None else []):
        found = _config_in_folder(folder)
        if found is not None:
            return found
    raise WeightsError(
        f"no model config for {fmt} weights {spec.weights!r}: set 'model' (e.g. wan2.1-t2v-1.3b) "
        "or 'base' (a Wan release folder with config.json)"
    )


# -- reading state dicts ----------------------------------------------------------------


def _load_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in files:
        # safe_open memory-maps the file; tensors are read when touched.
        with _safe_open(file, device="cpu") as handle:
            for key in handle.keys():
                state[key] = handle.get_tensor(key)
    return state


def torch_load(path: Path, *, allow_pickle: bool, option: str = "allow_pickle: true") -> Any:
    """torch.load, memory-mapped, refusing to unpickle code unless allowed.

    ``option`` names the setting that allows unpickling, for the error message.
    """
    kwargs = dict(map_location="cpu", weights_only=not allow_pickle)
    try:
        try:
            return torch.load(path, mmap=True, **kwargs)
        except RuntimeError as exc:
            # Files saved with _use_new_zipfile_serialization=False cannot be mapped.
            if "mmap" not in str(exc) and "zip" not in str(exc):
                raise WeightsError(f"{path} is not a readable torch file (corrupt or truncated?): {exc}") from None
            try:
                return torch.load(path, **kwargs)
            except (RuntimeError, EOFError) as again:
                raise WeightsError(f"{path} is not a readable torch file (corrupt or truncated?): {again}") from None
    except pickle.UnpicklingError as exc:
        # The refusal names the global it would not load; anything else is a broken file.
        if allow_pickle or "global" not in str(exc).lower():
            raise WeightsError(f"{path} is not a readable torch file (corrupt or truncated?): {_plain(str(exc))[:200]}") from None
        raise WeightsError(
            f"{path} holds objects beyond tensors, and unpickling them is refused by default "
            f"(it can run code); if you trust the file, set {option} ({_plain(str(exc).splitlines()[0])[:120]})"
        ) from None


def _plain(text: str) -> str:
    """Without terminal escape codes (torch bolds parts of its messages)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    if state and all(key.startswith(prefix) for key in state):
        return {key[len(prefix) :]: value for key, value in state.items()}
    return dict(state)


def read_self_forcing_state(path: Path, *, ema: bool = True, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The generator state dict of a Self-Forcing checkpoint, ``model.`` stripped."""
    data = torch_load(path, allow_pickle=allow_pickle)
    if not isinstance(data, Mapping):
        raise WeightsError(f"{path} holds a {type(data).__name__}, not a state dict")
    wanted = "generator_ema" if ema else "generator"
    if wanted in data:
        state = data[wanted]
    elif any(k in data for k in ("generator", "generator_ema")):
        present = [k for k in ("generator", "generator_ema") if k in data]
        option = "ema: false" if wanted == "generator_ema" else "ema: true"
        raise WeightsError(f"{path} has no {wanted!r} (it has {present}); set {option} to load the other")
    elif all(isinstance(v, torch.Tensor) for v in data.values()):
        state = data  # a bare state dict
    else:
        raise WeightsError(f"{path} has neither 'generator_ema' nor 'generator' (keys: {sorted(data)[:8]})")
    if not isinstance(state, Mapping):
        raise WeightsError(f"{path}: {wanted!r} is a {type(state).__name__}, not a state dict")
    return _strip_prefix(_strip_prefix(state, "model."), "_orig_mod.")


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
    for pattern, replacement in _DIFFUSERS_TO_WAN:
        key = re.sub(pattern, replacement, key)
    return key


def read_state_dict(path: Path, fmt: str, *, ema: bool = True, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The transformer state dict at ``path`` in original Wan key names."""
    if fmt == "self_forcing":
        if path.is_dir():
            raise WeightsError(f"format 'self_forcing' expects a .pt file, got the folder {path}")
        return read_self_forcing_state(path, ema=ema, allow_pickle=allow_pickle)
    if path.is_dir():
        files = _folder_weight_files(_transformer_folder(path))
    elif path.suffix == ".safetensors":
        files = [path]
    else:
        raise WeightsError(f"format {fmt!r} expects a folder or .safetensors file, got {path}")
    state = _load_safetensors(files)
    if fmt == "diffusers":
        state = {diffusers_to_wan_key(k): v for k, v in state.items() if not k.startswith("rope.")}
    elif fmt == "wan":
        state = _strip_prefix(state, "model.diffusion_model.")
    else:
        raise WeightsError(f"unknown weights format {fmt!r}")
    return state


def check_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Strict key and shape check, failing with counts and the first names."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [
        f"{k} {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state and tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("shape mismatches", mismatched)):
        if names:
            problems.append(f"{len(names)} {label} (first: {', '.join(names[:4])})")
    if problems:
        raise WeightsError(f"{source} does not fit the model: " + "; ".join(problems))


def load_transformer(
    path: str | Path,
    *,
    format: str = "auto",
    model: str | WanConfig | None = None,
    base: str | Path | None = None,
    ema: bool = True,
    allow_pickle: bool = False,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str = torch.float32,
) -> WanModel:
    """The project's transformer with the weights at ``path`` (format detected or forced).

    ``model`` names the config (e.g. ``"wan2.1-t2v-1.3b"``); without it the config
    comes from the weights folder's config.json, or from ``base``'s.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"weights path {str(path)!r} does not exist")
    fmt = detect_format(path) if format == "auto" else format
    if isinstance(dtype, str):
        if dtype == "auto":
            dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
        elif dtype in DTYPES:
            dtype = DTYPES[dtype]
        else:
            raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    if model is not None:
        config = get_model_config(model)
    else:
        config = None
        for folder in ([path] if path.is_dir() else []) + ([Path(base)] if base is not None else []):
            config = _config_in_folder(folder)
            if config is not None:
                break
        if config is None:
            raise WeightsError(f"no config.json beside {path}; pass model= (e.g. 'wan2.1-t2v-1.3b') or base=")
    state = read_state_dict(path, fmt, ema=ema, allow_pickle=allow_pickle)
    with torch.device("meta"):
        net = WanModel(config)
    check_state_dict(net, state, f"{fmt} weights {path}")
    net.load_state_dict(state, strict=True, assign=True)
    return net.to(device=device, dtype=dtype).eval().requires_grad_(False)


# -- the pipeline's view: checkpoint entries ---------------------------------------------


def compute_dtype(spec: "CheckpointSpec", device: torch.device) -> torch.dtype:
    if spec.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[spec.dtype]


def load_checkpoint(spec: "CheckpointSpec", *, device: torch.device, base_dir: str | Path = ".") -> WanModel:
    """Load a checkpoint entry of the config on ``device`` in its compute dtype."""
    dtype = compute_dtype(spec, device)
    if spec.is_demo:
        return build_model(spec.model or "demo", seed=spec.seed, dtype=dtype, device=device)
    base_dir = Path(base_dir)
    return load_transformer(
        _resolve(spec.weights, base_dir),
        format=spec.format,
        model=spec.model or resolve_model_config(spec, base_dir),
        base=_resolve(spec.base, base_dir),
        ema=spec.ema,
        allow_pickle=spec.allow_pickle,
        device=device,
        dtype=dtype,
    )


def weight_files(spec: "CheckpointSpec", base_dir: str | Path = ".") -> list[Path]:
    """The files whose bytes are the checkpoint's weights (empty for the demo)."""
    if spec.is_demo:
        return []
    path = _resolve(spec.weights, Path(base_dir))
    if path.is_file():
        return [path]
    folder = _transformer_folder(path)
    extra = [f for f in (folder / "config.json", *folder.glob("*.safetensors.index.json")) if f.is_file()]
    return sorted(_folder_weight_files(folder) + extra)


def weights_digest(spec: "CheckpointSpec", base_dir: str | Path = ".", cache: str | Path | None = None) -> str:
    """sha256 of the weight files (names and bytes), or of the demo's seeded tensors.

    With ``cache`` (a JSON file), a digest is reused while every file keeps its size
    and mtime: hashing 5.7 GB happens once, and a touched but unchanged file hashes
    to the same digest, so nothing downstream reruns.
    """
    if spec.is_demo:
        key = f"demo:{spec.model or 'demo'}:{spec.seed}"
        return _cached(key, cache, lambda: _hash_demo_weights(spec))
    return files_digest(weight_files(spec, base_dir), cache)


def files_digest(files: list[str | Path], cache: str | Path | None = None) -> str:
    """sha256 over the files' names and bytes, cached by (path, size, mtime)."""
    files = [Path(f) for f in files]
    key = json.dumps([[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files])
    return _cached(key, cache, lambda: _hash_files(files))


def _cached(key: str, cache: str | Path | None, compute) -> str:
    store: dict[str, str] = {}
    if cache is not None and Path(cache).is_file():
        try:
            store = json.loads(Path(cache).read_text())
        except json.JSONDecodeError:
            store = {}
    if key in store:
        return store[key]
    value = compute()
    if cache is not None:
        from ..io import atomic_path

        store[key] = value
        with atomic_path(cache) as tmp:
            tmp.write_text(json.dumps(store, indent=1))
    return value


def _hash_demo_weights(spec: "CheckpointSpec") -> str:
    digest = hashlib.sha256()
    model = build_model(spec.model or "demo", seed=spec.seed)
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def _hash_files(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        with open(file, "rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()

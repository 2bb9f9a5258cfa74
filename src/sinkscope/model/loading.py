"""Loading transformer weights (the torch side of ``sinkscope.model.checkpoints``).

``sinkscope.model.checkpoints`` finds out what a checkpoint is (format, model config,
files) without torch; this module reads the state dict and builds the model.

Loading is strict (missing/unexpected keys and shape mismatches fail, with counts and
the first names), safe (``torch.load(weights_only=True)`` unless ``allow_pickle``) and
lazy where the format allows (safetensors and ``.pt`` files are memory-mapped, and the
model is built on the meta device, so the weights are never copied twice).

A LoRA adapter (``lora:``) is merged into the state dict before it is loaded:
``W <- W + scale * (B @ A)``, computed in float32 (float64 for a float64 model) on the
target device and cast to the model's dtype once.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from sinkscope.errors import WeightsError
from sinkscope.model.checkpoints import (
    FSDP_WRAPPER,
    CheckpointSpec,
    ResolvedCheckpoint,
    check_shapes,
    check_torch_file,
    config_in_folder,
    detect_format,
    diffusers_to_wan_key,
    folder_weight_files,
    resolve_checkpoint,
    resolve_path,
    safetensors_header,
    transformer_folder,
)
from sinkscope.model.config import WanConfig, get_model_config
from sinkscope.model.lora import LoraSpec, ResolvedLora, resolve_lora
from sinkscope.model.wan import WanModel, build_model

__all__ = ["WeightsError", "detect_format", "load_checkpoint", "load_transformer", "merge_lora", "torch_load"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# -- reading state dicts ----------------------------------------------------------------


def _safe_open(path: Path, **options):
    """safetensors' safe_open, with a corrupt or truncated file named in a WeightsError."""
    from safetensors import safe_open

    safetensors_header(path)  # a clear message for files that are not safetensors
    try:
        return safe_open(str(path), framework="pt", **options)
    except Exception as exc:  # noqa: BLE001 - SafetensorError is not a common base class
        raise WeightsError(f"{path} is not a readable .safetensors file (corrupt or truncated?): {exc}") from None


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
    check_torch_file(path)
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
    # FSDP's wrapper names, which Causal Forcing's inference.py also removes on load.
    state = {key.replace(FSDP_WRAPPER, ""): value for key, value in state.items()}
    return _strip_prefix(_strip_prefix(state, "model."), "_orig_mod.")


def read_state_dict(path: Path, fmt: str, *, ema: bool = True, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The transformer state dict at ``path`` in original Wan key names."""
    if fmt == "self_forcing":
        if path.is_dir():
            raise WeightsError(f"format 'self_forcing' expects a .pt file, got the folder {path}")
        return read_self_forcing_state(path, ema=ema, allow_pickle=allow_pickle)
    if path.is_dir():
        files = folder_weight_files(transformer_folder(path))
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
    check_shapes({k: tuple(v.shape) for k, v in state.items()}, {k: tuple(v.shape) for k, v in model.state_dict().items()},
                 source)  # fmt: skip


# -- LoRA adapters -----------------------------------------------------------------------


def read_lora_tensors(lora: ResolvedLora, *, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The adapter's tensors by their keys in the file (the .pt's ``generator_lora`` entry, or its top level)."""
    if lora.tensors.suffix == ".safetensors":
        return _load_safetensors([lora.tensors])
    data = torch_load(lora.tensors, allow_pickle=allow_pickle)
    if lora.state_key is not None:
        data = data.get(lora.state_key) if isinstance(data, Mapping) else None
    if not isinstance(data, Mapping):
        raise WeightsError(f"{lora.tensors} no longer holds the LoRA state dict it held when the config was checked")
    return dict(data)


@contextmanager
def _full_float32_matmul() -> Iterator[None]:
    """Matmuls in full float32 (no TF32) while the adapter is merged: the merge is exact,
    whatever precision the rest of the run chose."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def merge_lora(
    state: dict[str, torch.Tensor],
    lora: ResolvedLora,
    tensors: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> None:
    """``W <- W + scale * (B @ A)`` for every adapted Linear of ``state`` (Wan names), in place.

    The sum is computed in float32 (float64 when ``dtype`` is) on ``device`` from the
    weights as stored, and cast to ``dtype`` once: a bfloat16 model gets the rounded
    merged weight, not the sum of two rounded terms.
    """
    compute = torch.promote_types(torch.float32, dtype)
    with _full_float32_matmul(), torch.no_grad():
        for module in lora.modules:
            key = f"{module.module}.weight"
            lora_a, lora_b, weight = tensors.get(module.key_a), tensors.get(module.key_b), state.get(key)
            # Keys and shapes were checked without torch (against the config the adapter was
            # resolved with); a file replaced since then, or another model, is caught here.
            if weight is None:
                raise WeightsError(f"{lora.tensors}: key {module.key_a!r} adapts {module.module!r}, which this model lacks")
            if lora_a is None or lora_b is None:
                raise WeightsError(f"{lora.tensors}: key {module.key_a!r} or {module.key_b!r} is gone since the config check")
            out_features, in_features = weight.shape
            if tuple(lora_a.shape) != (module.rank, in_features) or tuple(lora_b.shape) != (out_features, module.rank):
                raise WeightsError(f"{lora.tensors}: key {module.key_a!r} no longer fits {key} (replaced since the check?)")
            delta = lora_b.to(device, compute) @ lora_a.to(device, compute)
            state[key] = (weight.to(device, compute) + module.scale * delta).to(dtype)


def _resolved_lora(
    lora: str | Mapping | LoraSpec | ResolvedLora | None, config: WanConfig, allow_pickle: bool
) -> ResolvedLora | None:
    if lora is None or isinstance(lora, ResolvedLora):
        return lora
    return resolve_lora(LoraSpec.from_config(lora), config, allow_pickle=allow_pickle)


# -- the transformer ----------------------------------------------------------------------


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
    lora: str | Mapping | LoraSpec | ResolvedLora | None = None,
) -> WanModel:
    """The project's transformer with the weights at ``path`` (format detected or forced).

    ``model`` names the config (e.g. ``"wan2.1-t2v-1.3b"``); without it the config
    comes from the weights folder's config.json, or from ``base``'s. ``lora`` (a path,
    a ``{path, rank, alpha}`` mapping, or a resolved adapter) is merged into the weights.
    """
    path = resolve_path(str(path))
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
            config = config_in_folder(folder)
            if config is not None:
                break
        if config is None:
            raise WeightsError(f"no config.json beside {path}; pass model= (e.g. 'wan2.1-t2v-1.3b') or base=")
    adapter = _resolved_lora(lora, config, allow_pickle)
    state = read_state_dict(path, fmt, ema=ema, allow_pickle=allow_pickle)
    with torch.device("meta"):
        net = WanModel(config)
    check_state_dict(net, state, f"{fmt} weights {path}")
    if adapter is not None:
        merge_lora(state, adapter, read_lora_tensors(adapter, allow_pickle=allow_pickle), dtype=dtype, device=device)
    net.load_state_dict(state, strict=True, assign=True)
    return net.to(device=device, dtype=dtype).eval().requires_grad_(False)


# -- the pipeline's view: checkpoint entries ---------------------------------------------


def compute_dtype(spec: CheckpointSpec, device: torch.device) -> torch.dtype:
    """The checkpoint's dtype option on ``device``: auto is bfloat16 on CUDA, float32 elsewhere."""
    if spec.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[spec.dtype]


def load_checkpoint(
    checkpoint: ResolvedCheckpoint | CheckpointSpec, *, device: torch.device, base_dir: str | Path = "."
) -> WanModel:
    """Load a checkpoint entry of the config on ``device`` in its compute dtype."""
    if isinstance(checkpoint, CheckpointSpec):
        checkpoint = resolve_checkpoint(checkpoint, base_dir)
    spec = checkpoint.spec
    dtype = compute_dtype(spec, device)
    if checkpoint.format == "demo":
        return build_model(checkpoint.model_config, seed=spec.seed, dtype=dtype, device=device)
    return load_transformer(
        checkpoint.weights,
        format=checkpoint.format,
        model=checkpoint.model_config,
        base=checkpoint.base,
        ema=spec.ema,
        allow_pickle=spec.allow_pickle,
        device=device,
        dtype=dtype,
        lora=checkpoint.lora,
    )

"""Loading transformer weights (the torch side of ``sinkscope.model.checkpoints``).

``sinkscope.model.checkpoints`` finds out what a checkpoint is (format, model config,
files) without torch; this module has the checkpoint's format (``sinkscope.model.formats``)
read the state dict, and builds the model.

Loading is strict (missing/unexpected keys and shape mismatches fail, with counts and
the first names), safe (``torch.load(weights_only=True)`` unless ``allow_pickle``) and
lazy where the format allows (safetensors and ``.pt`` files are memory-mapped, and the
model is built on the meta device, so the weights are never copied twice).

A LoRA adapter (``lora:``) is merged into the state dict before it is loaded:
``W <- W + scale * (B @ A)``, computed in float32 (float64 for a float64 model) on the
target device and cast to the model's dtype once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch

from sinkscope.errors import WeightsError
from sinkscope.model.checkpoints import CheckpointSpec, ResolvedCheckpoint, resolve_checkpoint, weight_options
from sinkscope.model.config import WanConfig, get_model_config
from sinkscope.model.formats import (
    WeightOptions,
    config_in_folder,
    detect_format,
    weight_format,
)
from sinkscope.model.lora import LoraSpec, ResolvedLora, resolve_lora
from sinkscope.model.wan import WanModel
from sinkscope.model.weightfiles import check_shapes, load_safetensors, missing_path, resolve_path, torch_load

__all__ = ["WeightsError", "detect_format", "load_checkpoint", "load_transformer", "merge_lora", "torch_load"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# -- reading state dicts ----------------------------------------------------------------


def check_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Strict key and shape check, failing with counts and the first names."""
    check_shapes(
        {k: tuple(v.shape) for k, v in state.items()},
        {k: tuple(v.shape) for k, v in model.state_dict().items()},
        source,
    )


# -- LoRA adapters -----------------------------------------------------------------------


def read_lora_tensors(lora: ResolvedLora, *, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The adapter's tensors by their keys in the file (the .pt's ``generator_lora`` entry, or its top level)."""
    if lora.tensors.suffix == ".safetensors":
        return load_safetensors([lora.tensors])
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
    merged weight, not the sum of two rounded terms. A merged weight that is not finite (a
    huge alpha) is refused, naming the file, the module, its scale and alpha.
    """
    compute = torch.promote_types(torch.float32, dtype)
    with _full_float32_matmul(), torch.no_grad():
        for module in lora.modules:
            key = f"{module.module}.weight"
            lora_a, lora_b, weight = tensors.get(module.key_a), tensors.get(module.key_b), state.get(key)
            # Keys and shapes were checked without torch (against the config the adapter was
            # resolved with); a file replaced since then, or another model, is caught here.
            if weight is None:
                raise WeightsError(
                    f"{lora.tensors}: key {module.key_a!r} adapts {module.module!r}, which this model lacks"
                )
            if lora_a is None or lora_b is None:
                raise WeightsError(
                    f"{lora.tensors}: key {module.key_a!r} or {module.key_b!r} is gone since the config check"
                )
            out_features, in_features = weight.shape
            if tuple(lora_a.shape) != (module.rank, in_features) or tuple(lora_b.shape) != (out_features, module.rank):
                raise WeightsError(
                    f"{lora.tensors}: key {module.key_a!r} no longer fits {key} (replaced since the check?)"
                )
            delta = lora_b.to(device, compute) @ lora_a.to(device, compute)
            merged = (weight.to(device, compute) + module.scale * delta).to(dtype)
            if not torch.isfinite(merged).all():  # a huge alpha, or an adapter's own inf/NaN
                raise WeightsError(
                    f"{lora.tensors}: merging {key} at scale {module.scale:g} (alpha {module.alpha:g} / rank "
                    f"{module.rank}) gives weights that are not finite in {str(dtype).removeprefix('torch.')}"
                )
            state[key] = merged


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
    text = str(path)
    path = resolve_path(text)
    if not path.exists():
        raise FileNotFoundError(missing_path(f"weights path {text!r} does not exist", text))
    fmt = detect_format(path) if format == "auto" else format
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
    options = WeightOptions(ema=ema, allow_pickle=allow_pickle)
    return _load(fmt, path, config, options, device=device, dtype=_dtype(dtype, device), lora=adapter)


def _dtype(dtype: torch.dtype | str, device: torch.device | str) -> torch.dtype:
    if not isinstance(dtype, str):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")


def _load(
    fmt: str,
    path: Path | None,
    config: WanConfig,
    options: WeightOptions,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    lora: ResolvedLora | None,
) -> WanModel:
    """The model of ``config`` with the weights the format reads, checked strictly, the
    adapter merged; built on the meta device, so the weights are never copied twice."""
    weights = weight_format(fmt)
    net = weights.build(config, options)
    if net is None:
        state = weights.read(path, config, options)
        with torch.device("meta"):
            net = WanModel(config)
        check_state_dict(net, state, f"{fmt} weights {path}")
        if lora is not None:
            merge_lora(
                state, lora, read_lora_tensors(lora, allow_pickle=options.allow_pickle), dtype=dtype, device=device
            )
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
    dtype = compute_dtype(checkpoint.spec, device)
    return _load(
        checkpoint.format,
        checkpoint.weights,
        checkpoint.model_config,
        weight_options(checkpoint.spec),
        device=device,
        dtype=dtype,
        lora=checkpoint.lora,
    )

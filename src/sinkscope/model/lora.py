"""LoRA adapters on a checkpoint (the ``lora:`` key), found and checked without torch.

A checkpoint entry of any format may carry ``lora:``: a path, or ``{path, rank, alpha}``.
``resolve_lora`` reads what the adapter holds (safetensors headers as JSON, torch.save
archives through ``sinkscope.model.torchfile``, never unpickling), maps every adapted
module onto a Linear of the model and checks the shapes, so a wrong adapter fails while
the workflow is parsed, in one line naming the file and the key.
``sinkscope.model.loading.merge_lora`` then merges the adapter into the weights:
``W <- W + scale * (B @ A)``.

Layouts:

- a PEFT folder (``save_pretrained``): ``adapter_config.json`` (``r``, ``lora_alpha``,
  ``rank_pattern``, ``alpha_pattern``, ``use_rslora``) and ``adapter_model.safetensors``
  (or the older ``adapter_model.bin``);
- a ``.pt`` file: LongLive's trainer saves ``get_peft_model_state_dict`` under
  ``generator_lora``; a bare state dict at the top level works too;
- a ``.safetensors`` file of LoRA tensors.

Keys are PEFT's, ``base_model.model.<module>.lora_A.weight`` ([rank, in]) and
``...lora_B.weight`` ([out, rank]). ``<module>`` is a Linear in Wan's original names,
which are sinkscope's (``blocks.3.self_attn.q``, ``blocks.3.ffn.0``, ...); a wrapper
prefix common to every key (``model.``, ``_orig_mod.``, ``transformer.``,
``diffusion_model.``) is dropped, and diffusers' names (``attn1.to_q``,
``ffn.net.0.proj``) are mapped to Wan's.

The scale of a module is ``alpha / rank`` (``alpha / sqrt(rank)`` with ``use_rslora``).
A PEFT folder says rank and alpha in its adapter_config.json; a ``.pt`` or
``.safetensors`` file does not, so its rank is read from the tensors' shapes and alpha
is the config's ``alpha``, or else the rank itself (scale 1.0): LongLive trains with
rank 256 and alpha 256.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sinkscope.errors import WeightsError
from sinkscope.model.config import WanConfig, parameter_shapes
from sinkscope.model.formats import diffusers_to_wan_key
from sinkscope.model.weightfiles import (
    TORCH_SUFFIXES,
    cached_value,
    check_torch_file,
    missing_path,
    resolve_path,
    safetensors_header,
)

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# Where LongLive's trainer puts the generator's adapter in its .pt (beside critic_lora).
LONGLIVE_STATE_KEY = "generator_lora"
# PEFT's LoraConfig defaults, for an adapter_config.json that leaves r or lora_alpha out.
PEFT_DEFAULT_RANK = 8
PEFT_DEFAULT_ALPHA = 8
# Prefixes a training wrapper puts before the transformer's module names (Self-Forcing's
# WanDiffusionWrapper, torch.compile, diffusers pipelines, ComfyUI).
WRAPPER_PREFIXES = ("model.", "_orig_mod.", "transformer.", "diffusion_model.")
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")

_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")
# Module names only diffusers' WanTransformer3DModel uses.
_DIFFUSERS_NAMES = re.compile(r"(^|\.)(attn1|attn2|to_[qkv]|to_out|ffn\.net|proj_out|condition_embedder)(\.|$)")


@dataclass(frozen=True)
class LoraSpec:
    """The ``lora:`` of a checkpoint entry: where the adapter is, and optionally its rank
    (checked against the tensors) and alpha (for files that do not say it)."""

    path: str
    rank: int | None = None
    alpha: float | None = None

    @classmethod
    def from_config(cls, value: str | Mapping[str, Any] | LoraSpec | None) -> LoraSpec | None:
        """A path string or a ``{path, rank, alpha}`` mapping (None: no adapter)."""
        if value is None or isinstance(value, LoraSpec):
            return value
        if isinstance(value, str):
            return cls(path=value)
        if not isinstance(value, Mapping):
            raise WeightsError(f"expected a path or a mapping {{path, rank, alpha}}, not {value!r}")
        unknown = sorted(set(value) - {"path", "rank", "alpha"})
        if unknown:
            raise WeightsError(f"unknown keys {unknown} (known: path, rank, alpha)")
        if not isinstance(value.get("path"), str) or not value["path"]:
            raise WeightsError(f"'path' (the adapter file or PEFT folder) is missing in {dict(value)!r}")
        return cls(path=value["path"], rank=value.get("rank"), alpha=value.get("alpha"))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LoraModule:
    """One adapted Linear: its name in the model, its two tensors' keys in the file, its scale."""

    module: str
    key_a: str
    key_b: str
    rank: int
    alpha: float
    scale: float


@dataclass(frozen=True)
class ResolvedLora:
    """An adapter, checked against a model config."""

    spec: LoraSpec
    layout: str  # "peft" (a folder), "torch" (a .pt file) or "safetensors"
    path: Path  # the folder or file the config names
    tensors: Path  # the file holding the tensors
    state_key: str | None  # the .pt's entry holding the state dict ("generator_lora"), None at the top level
    modules: tuple[LoraModule, ...]

    def files(self) -> list[Path]:
        """The files the adapter is made of (their bytes are part of the checkpoint's digest)."""
        config = self.path / PEFT_CONFIG
        return [config, self.tensors] if self.layout == "peft" else [self.tensors]

    def scales(self) -> dict[str, float]:
        return {m.module: m.scale for m in self.modules}

    def summary(self) -> str:
        ranks = sorted({m.rank for m in self.modules})
        scales = sorted({m.scale for m in self.modules})
        return (
            f"{len(self.modules)} Linear layers, rank {'/'.join(map(str, ranks))}, "
            f"scale {'/'.join(f'{s:g}' for s in scales)}"
        )


def linear_shapes(config: WanConfig) -> dict[str, tuple[int, int]]:
    """Every Linear of the transformer, ``{name: (out_features, in_features)}``: the
    two-dimensional weights of the state dict (convolutions are 5-D, norms 1-D)."""
    return {
        name[: -len(".weight")]: shape
        for name, shape in parameter_shapes(config).items()
        if name.endswith(".weight") and len(shape) == 2
    }


# -- reading what an adapter holds -----------------------------------------------------------


def resolve_lora(
    spec: LoraSpec,
    config: WanConfig,
    *,
    base_dir: str | Path = ".",
    allow_pickle: bool = False,
    cache: Path | None = None,
) -> ResolvedLora:
    """The adapter ``spec`` names, checked against ``config`` without torch.

    Raises FileNotFoundError or WeightsError, one line naming the file (and the key).
    ``cache`` (a JSON file) keeps the result of reading a whole .pt (its CRCs) while the
    file keeps its size and mtime.
    """
    path = resolve_path(spec.path, base_dir)
    if not path.exists():
        raise FileNotFoundError(missing_path(f"adapter {spec.path!r} does not exist (looked at {path})", spec.path))
    if path.is_dir():
        peft = _read_peft_config(path, spec)
        tensors = next((path / name for name in PEFT_WEIGHTS if (path / name).is_file()), None)
        if tensors is None:
            raise FileNotFoundError(f"{path} has {PEFT_CONFIG} but no {' or '.join(PEFT_WEIGHTS)}")
        state_key, shapes = _tensor_shapes(tensors, allow_pickle, cache, top_level_only=True)
        layout = "peft"
    elif path.suffix == ".safetensors" or path.suffix in TORCH_SUFFIXES:
        peft, tensors = None, path
        state_key, shapes = _tensor_shapes(path, allow_pickle, cache, top_level_only=False)
        layout = "safetensors" if path.suffix == ".safetensors" else "torch"
    else:
        raise WeightsError(
            f"cannot tell what the adapter {path} is: expected a PEFT folder ({PEFT_CONFIG}), .safetensors or .pt"
        )
    modules = _match_modules(shapes, tensors, config, spec, peft)
    return ResolvedLora(spec, layout, path, tensors, state_key, modules)


@dataclass(frozen=True)
class _PeftSettings:
    rank: int
    alpha: float
    rank_pattern: dict[str, int]
    alpha_pattern: dict[str, float]
    use_rslora: bool


def _read_peft_config(folder: Path, spec: LoraSpec) -> _PeftSettings:
    path = folder / PEFT_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"adapter folder {folder} has no {PEFT_CONFIG} (a PEFT save_pretrained folder has)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WeightsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: expected a JSON object")
    peft_type = str(data.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise WeightsError(f"{path}: key 'peft_type' is {data['peft_type']!r}; only LoRA adapters can be merged")
    # Variants whose merge is not W + scale * B @ A, or that replace weights besides the
    # adapted ones: refused rather than merged wrongly.
    for key, plain in (("use_dora", False), ("lora_bias", False), ("bias", "none")):
        if data.get(key, plain) not in (plain, None):
            raise WeightsError(f"{path}: key {key!r} is {data[key]!r}; only plain LoRA ({key}: {plain!r}) is supported")
    if data.get("modules_to_save"):
        raise WeightsError(
            f"{path}: key 'modules_to_save' is {data['modules_to_save']!r}; adapters that replace whole "
            "modules are not supported"
        )
    settings = _PeftSettings(
        rank=int(data.get("r", PEFT_DEFAULT_RANK)),
        alpha=float(data.get("lora_alpha", PEFT_DEFAULT_ALPHA)),
        rank_pattern={str(k): int(v) for k, v in (data.get("rank_pattern") or {}).items()},
        alpha_pattern={str(k): float(v) for k, v in (data.get("alpha_pattern") or {}).items()},
        use_rslora=bool(data.get("use_rslora", False)),
    )
    # The folder says rank and alpha; a config that says otherwise is a mistake, not an override.
    for key, mine, theirs in (("rank", spec.rank, settings.rank), ("alpha", spec.alpha, settings.alpha)):
        if mine is not None and float(mine) != float(theirs):
            peft_key = "r" if key == "rank" else "lora_alpha"
            raise WeightsError(
                f"{path}: key {peft_key!r} is {theirs:g}, the config's lora.{key} is {mine:g}; "
                f"leave lora.{key} out for a PEFT folder"
            )
    return settings


def _tensor_shapes(
    path: Path, allow_pickle: bool, cache: Path | None, *, top_level_only: bool
) -> tuple[str | None, dict[str, tuple[int, ...]]]:
    """(the .pt entry holding the state dict or None, {key: shape}) of an adapter file."""
    if path.suffix == ".safetensors":
        shapes = {}
        for key, entry in safetensors_header(path).items():
            if not isinstance(entry, dict) or "shape" not in entry:
                continue
            if entry.get("dtype") not in FLOAT_DTYPES:
                raise WeightsError(f"{path}: key {key!r} holds {entry.get('dtype')}, not floating-point LoRA weights")
            shapes[key] = tuple(int(s) for s in entry["shape"])
        return None, shapes
    stat = path.stat()
    key = json.dumps(["lora", str(path.resolve()), stat.st_size, stat.st_mtime_ns, allow_pickle, top_level_only])
    found = cached_value(key, cache, lambda: _read_torch_adapter(path, allow_pickle, top_level_only))
    return found["state_key"], {k: tuple(v) for k, v in found["shapes"].items()}


def _read_torch_adapter(path: Path, allow_pickle: bool, top_level_only: bool) -> dict[str, Any]:
    from sinkscope.model.torchfile import read_trusted_structure, tensor_shapes

    check_torch_file(path)
    data = read_trusted_structure(path, allow_pickle=allow_pickle, option="the checkpoint's allow_pickle: true")
    if not isinstance(data, dict):
        raise WeightsError(f"{path} holds a {type(data).__name__}, not a dict of LoRA tensors")
    state_key = None
    if not top_level_only and LONGLIVE_STATE_KEY in data:
        state_key, data = LONGLIVE_STATE_KEY, data[LONGLIVE_STATE_KEY]
    shapes = tensor_shapes(data)
    if shapes is None and state_key is not None:
        raise WeightsError(f"{path}: its {state_key!r} is not a state dict of LoRA tensors")
    if shapes is None:
        keys = ", ".join(map(str, list(data)[:6]))
        raise WeightsError(
            f"{path} is neither a state dict of LoRA tensors nor a dict with {LONGLIVE_STATE_KEY!r} (its keys: {keys})"
        )
    return {"state_key": state_key, "shapes": {k: list(v) for k, v in shapes.items()}}


# -- keys onto the model's Linear layers -----------------------------------------------------


def _pattern_value(patterns: Mapping[str, Any], name: str, default: Any) -> Any:
    """PEFT's rank_pattern / alpha_pattern lookup: the first pattern that matches the end
    of the module name at a dot boundary (a regular expression) wins."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", name):
            return value
    return default


def _common_prefix(names: list[str]) -> str:
    for prefix in WRAPPER_PREFIXES:
        if names and all(name.startswith(prefix) for name in names):
            return prefix
    return ""


def to_model_name(name: str) -> str:
    """A module name as the adapter gives it (wrapper prefixes gone) in the model's names."""
    if _DIFFUSERS_NAMES.search(name):
        return diffusers_to_wan_key(name + ".weight")[: -len(".weight")]
    return name


def _match_modules(
    shapes: Mapping[str, tuple[int, ...]], file: Path, config: WanConfig, spec: LoraSpec, peft: _PeftSettings | None
) -> tuple[LoraModule, ...]:
    if not shapes:
        raise WeightsError(f"{file} holds no tensors; not a LoRA adapter")
    pairs: dict[str, dict[str, str]] = {}  # module as in the file -> {"A": key, "B": key}
    for key in shapes:
        match = _LORA_KEY.match(key)
        if match is None:
            raise WeightsError(
                f"{file}: key {key!r} is not a LoRA tensor (<module>.lora_A.weight or <module>.lora_B.weight); "
                "is this a LoRA adapter?"
            )
        module = match["module"].removeprefix("base_model.model.")
        pairs.setdefault(module, {})[match["part"]] = key
    linears = linear_shapes(config)
    all_shapes = parameter_shapes(config)
    # PEFT matched rank_pattern against the names the file carries; the model is matched
    # after the wrapper's prefix is gone.
    names = list(pairs)
    prefix = _common_prefix(names)
    while prefix:  # wrappers nest (a compiled Self-Forcing wrapper: model._orig_mod.)
        names = [name[len(prefix) :] for name in names]
        prefix = _common_prefix(names)
    modules: list[LoraModule] = []
    targets: dict[str, str] = {}
    for (name, keys), stripped in zip(pairs.items(), names, strict=True):
        for part, other in (("A", "B"), ("B", "A")):
            if part in keys and other not in keys:
                raise WeightsError(f"{file}: key {keys[part]!r} has no lora_{other} partner")
        key_a, key_b = keys["A"], keys["B"]
        target = to_model_name(stripped)
        if target not in linears:
            if target + ".weight" in all_shapes:
                raise WeightsError(f"{file}: key {key_a!r} adapts {target!r}, which is not a Linear layer of the model")
            raise WeightsError(
                f"{file}: key {key_a!r} adapts {target!r}, which the model ({config.num_layers} blocks) does not have"
            )
        if target in targets:
            raise WeightsError(f"{file}: key {key_a!r} adapts {target!r} a second time (also {targets[target]!r})")
        targets[target] = key_a
        out_features, in_features = linears[target]
        shape_a, shape_b = tuple(shapes[key_a]), tuple(shapes[key_b])
        if len(shape_a) != 2 or shape_a[1] != in_features or shape_a[0] < 1:
            raise WeightsError(
                f"{file}: key {key_a!r} has shape {shape_a}, expected (rank, {in_features}) for {target} "
                f"({in_features} -> {out_features})"
            )
        rank = shape_a[0]
        if shape_b != (out_features, rank):
            raise WeightsError(
                f"{file}: key {key_b!r} has shape {shape_b}, expected ({out_features}, {rank}) for {target} "
                f"({in_features} -> {out_features}, rank {rank} from lora_A)"
            )
        if peft is not None:
            declared = int(_pattern_value(peft.rank_pattern, name, peft.rank))
            if rank != declared:
                raise WeightsError(f"{file}: key {key_a!r} has rank {rank}, {PEFT_CONFIG} gives {name} rank {declared}")
            alpha = float(_pattern_value(peft.alpha_pattern, name, peft.alpha))
            scale = alpha / math.sqrt(rank) if peft.use_rslora else alpha / rank
        else:
            if spec.rank is not None and rank != spec.rank:
                raise WeightsError(f"{file}: key {key_a!r} has rank {rank}, the config's lora.rank is {spec.rank}")
            # The file does not say alpha: the config's, else alpha = rank (scale 1, LongLive's 256/256).
            alpha = float(spec.alpha) if spec.alpha is not None else float(rank)
            scale = alpha / rank
        modules.append(LoraModule(target, key_a, key_b, rank, alpha, scale))
    return tuple(modules)

"""A checkpoint entry of the config, resolved once: format, model config, files, digest.

Everything here works without torch (safetensors headers are read as JSON, ``.pt``
files through ``sinkscope.model.torchfile`` without unpickling), so the Snakefile
resolves every checkpoint while it parses, and a wrong path or a file that is not what
its format says fails before any job runs. ``sinkscope.model.loading`` takes a
``ResolvedCheckpoint`` and does the torch side (reading and loading state dicts).

The formats (detected, or forced by a checkpoint's ``format``) are the registry of
``sinkscope.model.formats``: ``wan`` (the Wan2.1 release folder or an original-format
``.safetensors``), ``self_forcing`` (a ``.pt`` with ``generator_ema`` / ``generator``),
``diffusers`` (a ``WanTransformer3DModel`` folder) and ``demo`` (no file; seeded random
weights of a named config). This module only asks the format.

Weights paths may start with ``sinkscope:`` to name a file shipped in the package
(``sinkscope:demo_trained.pt`` is the trained demo model, ``sinkscope:demo_periodic.pt`` the earlier one).

Any format with a file may carry ``lora:``, a LoRA adapter merged into the weights at
load (``sinkscope.model.lora``; LongLive is a Self-Forcing-layout ``.pt`` plus one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sinkscope.errors import ConfigError, WeightsError
from sinkscope.model.config import WanConfig, get_model_config
from sinkscope.model.formats import (
    WeightOptions,
    config_in_folder,
    detect_format,
    weight_format,
)
from sinkscope.model.lora import LoraSpec, ResolvedLora, resolve_lora
from sinkscope.model.weightfiles import (
    cached_value,
    missing_path,
    read_json,
    resolve_path,
)

WAN_T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
WAN_TOKENIZER_DIR = "google/umt5-xxl"


# -- the config entry ---------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointSpec:
    """One ``checkpoints:`` entry, as the config gives it."""

    name: str
    model: str | None = None
    format: str = "auto"
    weights: str | None = None
    base: str | None = None
    seed: int = 0
    ema: bool = True
    allow_pickle: bool = False
    dtype: str = "auto"
    train_step: int | None = None
    # A LoRA adapter merged into the weights: a path, or {path, rank, alpha}; kept as
    # the config gives it (a LoraSpec, or a string or mapping the config check reads).
    lora: LoraSpec | str | Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        # One form for equal entries ('x.pt' and {path: x.pt}), so their params are equal.
        if self.lora is not None:
            try:
                object.__setattr__(self, "lora", LoraSpec.from_config(self.lora))
            except WeightsError as exc:
                raise ConfigError(f"config key checkpoints.{self.name}.lora: {exc}") from None

    @classmethod
    def from_config(cls, name: str, entry: Mapping[str, Any]) -> CheckpointSpec:
        fields = {f.name for f in dataclasses.fields(cls)} - {"name"}
        return cls(name=name, **{key: entry[key] for key in fields if key in entry})

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.lora is None:
            # Entries without an adapter keep the params (and results) they had before
            # the key existed.
            del data["lora"]
        return data

    @property
    def is_demo(self) -> bool:
        return self.format == "demo"


def checkpoint_specs(config: Mapping[str, Any]) -> dict[str, CheckpointSpec]:
    return {name: CheckpointSpec.from_config(name, entry) for name, entry in config["checkpoints"].items()}


# -- the resolved checkpoint ---------------------------------------------------------------


@dataclass(frozen=True)
class TextEncoderSpec:
    """Which encoder turns prompts into a checkpoint's context."""

    kind: str  # "demo" or "umt5"
    layout: str | None = None  # "wan" or "diffusers" for umT5
    folder: str | None = None
    text_dim: int = 4096
    text_len: int = 512

    @property
    def key(self) -> str:
        """A short, path-safe name for the encoder (a wildcard of the workflow)."""
        if self.kind == "demo":
            return f"demo-{self.text_dim}x{self.text_len}"
        name = re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(self.folder).name) or "umt5"
        digest = hashlib.sha256(str(Path(self.folder).resolve()).encode()).hexdigest()[:6]
        return f"umt5-{name}-{digest}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def files(self) -> list[str]:
        """The files the encoder is made of (their digest is a param of the encoding job)."""
        if self.kind == "demo":
            return []
        folder = Path(self.folder)
        if self.layout == "wan":
            parts = [folder / WAN_T5_FILE, *sorted((folder / WAN_TOKENIZER_DIR).rglob("*"))]
        else:
            parts = sorted((folder / "text_encoder").rglob("*")) + sorted((folder / "tokenizer").rglob("*"))
        return [str(p) for p in parts if p.is_file()]


def umt5_layout(folder: Path) -> str | None:
    if not folder.is_dir():
        return None
    if (folder / WAN_T5_FILE).is_file() and (folder / WAN_TOKENIZER_DIR).is_dir():
        return "wan"
    if (folder / "text_encoder" / "config.json").is_file() and (folder / "tokenizer").is_dir():
        return "diffusers"
    return None


def text_encoder_spec(folders: list[Path], config: WanConfig, *, demo: bool) -> TextEncoderSpec:
    """umT5 from the first folder that holds it; the seeded demo encoder for the demo
    models; otherwise a FileNotFoundError naming what is missing."""
    if demo:
        # The demo's stand-in for umT5 (sinkscope.model.text.demo_embedding).
        return TextEncoderSpec("demo", text_dim=config.text_dim, text_len=config.text_len)
    for folder in folders:
        layout = umt5_layout(folder)
        if layout:
            return TextEncoderSpec("umt5", layout, str(folder), text_dim=config.text_dim, text_len=config.text_len)
    raise FileNotFoundError(_no_text_encoder(folders))


def _no_text_encoder(folders: list[Path]) -> str:
    where = ", ".join(str(f) for f in folders) or "no folder"
    return (
        f"no umT5 text encoder found ({where}); set 'base' to the Wan2.1 release folder "
        f"(with {WAN_T5_FILE} and {WAN_TOKENIZER_DIR}/) or to a diffusers folder (text_encoder/, tokenizer/)"
    )


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """What every stage needs to know about a checkpoint, found once."""

    spec: CheckpointSpec
    format: str  # the name of a registered format (sinkscope.model.formats), never auto
    weights: Path | None
    base: Path | None
    model_config: WanConfig
    lora: ResolvedLora | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def weight_files(self) -> list[Path]:
        """The files whose bytes are the weights (empty for the random demo)."""
        return [] if self.weights is None else weight_format(self.format).digest_files(self.weights)

    def text_encoder(self) -> TextEncoderSpec:
        """The prompt encoder of this checkpoint."""
        folders = [p for p in (self.base, self.weights) if p is not None]
        demo = self.weights is None or self.spec.model == "demo"
        return text_encoder_spec(folders, self.model_config, demo=demo)

    def digest(self, cache: str | Path | None = None) -> str:
        """sha256 of the weights' names and bytes; for the random demo, of what seeds them;
        with an adapter, of the weights' digest, the adapter's files and every module's scale."""
        if self.weights is None:
            blob = json.dumps({"demo": self.model_config.to_dict(), "seed": self.spec.seed}, sort_keys=True)
            return hashlib.sha256(blob.encode()).hexdigest()
        weights = files_digest(self.weight_files(), cache)
        if self.lora is None:
            return weights  # without an adapter the digest is the weights' own
        # The scales depend on the config's lora.alpha as well as on the files.
        blob = json.dumps(
            {"weights": weights, "lora": files_digest(self.lora.files(), cache), "scales": self.lora.scales()},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()


# The Wan VAE beside the transformer (sinkscope.model.vae reads both layouts): the original
# release file of the model's latent width, or a diffusers pipeline folder's vae/.
WAN_VAE_FILES = {16: "Wan2.1_VAE.pth", 48: "Wan2.2_VAE.pth"}
DIFFUSERS_VAE_DIR = "vae"


def vae_candidates(checkpoint: ResolvedCheckpoint) -> list[Path]:
    """Where the checkpoint's VAE would be, in the order looked at: in its release folder
    (``base``, or the weights folder; a diffusers ``transformer/`` folder's parent) the
    original file of the model's latent width, then a diffusers ``vae/`` folder."""
    folders = [p for p in (checkpoint.base, checkpoint.weights) if p is not None and p.is_dir()]
    folders += [p.parent for p in folders if p.name == "transformer"]
    name = WAN_VAE_FILES.get(checkpoint.model_config.in_dim, WAN_VAE_FILES[16])
    return [path for folder in dict.fromkeys(folders) for path in (folder / name, folder / DIFFUSERS_VAE_DIR)]


def find_vae(checkpoint: ResolvedCheckpoint) -> Path | None:
    """The checkpoint's Wan VAE (a ``.pth`` or a diffusers ``vae/`` folder whose z_dim is the
    model's latent width), or None; reads no weights (no torch)."""
    for path in vae_candidates(checkpoint):
        if path.is_file():
            return path
        config = path / "config.json"
        if config.is_file() and read_json(config).get("z_dim", 16) == checkpoint.model_config.in_dim:
            return path
    return None


def resolve_checkpoint(spec: CheckpointSpec, base_dir: str | Path = ".") -> ResolvedCheckpoint:
    """Resolve a checkpoint entry, checking that its files exist and are what the format says.

    Raises ConfigError naming the ``checkpoints.<name>`` key and the problem.
    """
    try:
        return _resolve(spec, Path(base_dir))
    except _MissingPaths as exc:
        raise ConfigError.invalid(
            [f"config key checkpoints.{spec.name}{'.lora' if key == 'lora' else ''}: {line}" for key, line in exc.lines]
        ) from None
    except _AdapterProblem as exc:
        raise ConfigError(f"config key checkpoints.{spec.name}.lora: {exc}") from None
    except (WeightsError, FileNotFoundError, KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise ConfigError(f"config key checkpoints.{spec.name}: {message}") from None


class _AdapterProblem(Exception):
    """A problem of the checkpoint's lora: adapter (named as its own config key)."""


class _MissingPaths(Exception):
    """Every path of the entry that does not exist, as (key, line): listed together."""

    def __init__(self, lines: list[tuple[str, str]]) -> None:
        super().__init__(lines)
        self.lines = lines


def _missing_paths(spec: CheckpointSpec, weights: Path, base: Path | None, base_dir: Path) -> list[tuple[str, str]]:
    """The weights, base folder and adapter the entry names that do not exist, and the
    umT5 text encoder when the base folder exists without it (the weights folder, the
    other place it may be, is missing): what a user fetches before anything else is read."""
    missing = []
    if not weights.exists():
        missing.append(
            ("weights", missing_path(f"weights {spec.weights!r} do not exist (looked at {weights})", spec.weights))
        )
    if base is not None and not base.is_dir():
        missing.append(("base", f"base folder {spec.base!r} does not exist (looked at {base})"))
    lora = spec.lora.path if isinstance(spec.lora, LoraSpec) else None
    adapter = resolve_path(lora, base_dir) if lora else None
    if adapter is not None and not adapter.exists():
        missing.append(("lora", missing_path(f"adapter {lora!r} does not exist (looked at {adapter})", lora)))
    if missing and not weights.exists() and base is not None and base.is_dir() and spec.model != "demo":
        if umt5_layout(base) is None:
            missing.append(("base", _no_text_encoder([base])))
    return missing


def _resolve(spec: CheckpointSpec, base_dir: Path) -> ResolvedCheckpoint:
    named = None if spec.format == "auto" else weight_format(spec.format)
    if named is not None and not named.takes_file:
        fmt = named
        if spec.weights:
            raise WeightsError(f"format {fmt.name!r} takes no weights file (it builds {fmt.summary})")
        if spec.lora is not None:
            raise WeightsError(f"format {fmt.name!r} takes no lora adapter (its weights are {fmt.summary})")
        return ResolvedCheckpoint(spec, fmt.name, None, None, get_model_config(spec.model or fmt.default_model))
    weights = resolve_path(spec.weights, base_dir)
    if weights is None:
        raise WeightsError(f"format {spec.format!r} needs 'weights' (a file or folder)")
    base = resolve_path(spec.base, base_dir)
    missing = _missing_paths(spec, weights, base, base_dir)
    if missing:
        raise _MissingPaths(missing)
    fmt = named or weight_format(detect_format(weights))
    fmt.files(weights)  # the layout the format expects, before anything else is asked of it
    if spec.model:
        config = get_model_config(spec.model)
    else:
        config = next(
            (
                found
                for folder in ([weights] if weights.is_dir() else []) + ([base] if base else [])
                if (found := config_in_folder(folder)) is not None
            ),
            None,
        )
        if config is None:
            raise WeightsError(
                f"no model config for {fmt.name} weights {spec.weights!r}: set 'model' (e.g. wan2.1-t2v-1.3b) "
                "or 'base' (a Wan release folder with config.json)"
            )
    check_weights(weights, fmt.name, spec, config, base_dir)
    lora = None
    if spec.lora is not None:
        try:
            lora = resolve_lora(
                spec.lora, config, base_dir=base_dir, allow_pickle=spec.allow_pickle, cache=base_dir / WEIGHT_CHECKS
            )
        except (WeightsError, FileNotFoundError, ValueError) as exc:
            raise _AdapterProblem(str(exc)) from None
    return ResolvedCheckpoint(spec, fmt.name, weights, base, config, lora)


# -- digests -------------------------------------------------------------------------------


def files_digest(files: list[str | Path], cache: str | Path | None = None) -> str:
    """sha256 over the files' names and bytes, cached by (path, size, mtime).

    With ``cache`` (a JSON file), a digest is reused while every file keeps its size
    and mtime: hashing 5.7 GB happens once, and a touched but unchanged file hashes
    to the same digest, so nothing downstream reruns.
    """
    files = [Path(f) for f in files]
    key = json.dumps([[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files])
    return cached_value(key, cache, lambda: _hash_files(files))


def _hash_files(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        with open(file, "rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


# -- what the weights hold -------------------------------------------------------------------

# Results of check_weights, reused while every file keeps its size and mtime (the check
# reads a whole .pt once to verify its CRCs).
WEIGHT_CHECKS = ".snakemake/sinkscope/weight-checks.json"


def weight_options(spec: CheckpointSpec) -> WeightOptions:
    """The entry's settings for reading its weights."""
    return WeightOptions(ema=spec.ema, allow_pickle=spec.allow_pickle, seed=spec.seed)


def check_weights(weights: Path, fmt: str, spec: CheckpointSpec, config: WanConfig, base_dir: Path) -> None:
    """That the weights are whole and hold exactly the tensors the model needs, with their
    shapes (the format's ``check``: headers and the archive's pickle, without torch and
    without unpickling); cached by the files' sizes and mtimes."""
    files = weight_format(fmt).files(weights)
    key = json.dumps(
        [
            fmt,
            spec.ema,
            spec.allow_pickle,
            dataclasses.asdict(config),
            [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files],
        ]
    )
    cached_value(
        key, base_dir / WEIGHT_CHECKS, lambda: weight_format(fmt).check(weights, config, weight_options(spec)) or "ok"
    )

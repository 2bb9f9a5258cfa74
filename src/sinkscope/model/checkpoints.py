"""A checkpoint entry of the config, resolved once: format, model config, files, digest.

Everything here works without torch (safetensors headers are read as JSON, ``.pt``
files are checked by their first bytes), so the Snakefile resolves every checkpoint
while it parses, and a wrong path or a file that is not what its format says fails
before any job runs. ``sinkscope.model.loading`` takes a ``ResolvedCheckpoint`` and
does the torch side (reading and loading state dicts).

Formats (detected, or forced by a checkpoint's ``format``):

- ``wan``: the Wan2.1 release folder (``config.json`` + ``diffusion_pytorch_model.safetensors``,
  sharded with an ``.index.json`` or not), or a single original-format ``.safetensors``;
- ``self_forcing``: a Self-Forcing ``.pt`` whose state dict sits under ``generator_ema``
  (or ``generator``), keys prefixed ``model.``;
- ``diffusers``: a ``WanTransformer3DModel`` folder (or a pipeline folder with
  ``transformer/``);
- ``demo``: no file; seeded random weights of a named config.

Weights paths may start with ``sinkscope:`` to name a file shipped in the package
(``sinkscope:demo_trained.pt`` is the trained demo model, ``sinkscope:demo_periodic.pt`` the earlier one).

Any format but ``demo`` may carry ``lora:``, a LoRA adapter merged into the weights at
load (``sinkscope.model.lora``; LongLive is a Self-Forcing-layout ``.pt`` plus one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sinkscope.errors import ConfigError, WeightsError
from sinkscope.io import atomic_path
from sinkscope.model.config import WanConfig, get_model_config

if TYPE_CHECKING:
    from sinkscope.model.lora import LoraSpec, ResolvedLora

WAN_WEIGHTS = "diffusion_pytorch_model.safetensors"
TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
PACKAGE_PREFIX = "sinkscope:"
PACKAGE_WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
WAN_T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
WAN_TOKENIZER_DIR = "google/umt5-xxl"
FORMATS = ("auto", "demo", "wan", "self_forcing", "diffusers")
# The name FSDP puts into a wrapped module's keys (model._fsdp_wrapped_module.blocks...);
# Self-Forcing-layout checkpoints saved from a wrapped model may carry it.
FSDP_WRAPPER = "_fsdp_wrapped_module."


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
            from sinkscope.model.lora import LoraSpec

            try:
                object.__setattr__(self, "lora", LoraSpec.from_config(self.lora))
            except WeightsError as exc:
                raise ConfigError(f"config key checkpoints.{self.name}.lora: {exc}") from None

    @classmethod
    def from_config(cls, name: str, entry: Mapping[str, Any]) -> "CheckpointSpec":
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


# -- files -----------------------------------------------------------------------------------


def resolve_path(path: str | None, base_dir: str | Path = ".") -> Path | None:
    """A config path: ``sinkscope:NAME`` is a file shipped in the package; relative paths
    resolve from ``base_dir`` (the workflow's working directory)."""
    if path is None:
        return None
    if path.startswith(PACKAGE_PREFIX):
        return PACKAGE_WEIGHTS / path[len(PACKAGE_PREFIX) :]
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base_dir) / p


def _read_json(path: Path) -> dict:
    try:
        with open(path) as handle:
            data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise WeightsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: expected a JSON object")
    return data


def transformer_folder(path: Path) -> Path:
    """A diffusers pipeline folder keeps the transformer under transformer/."""
    sub = path / "transformer"
    return sub if (sub / "config.json").is_file() else path


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file (tensor names, dtypes, shapes), read
    without torch; a file that is not safetensors fails naming the file."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(8)
            size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            file_size = path.stat().st_size
            if not 2 <= size <= min(file_size - 8, 100 * 2**20):
                raise WeightsError(f"{path} is not a .safetensors file (no valid header; corrupt or truncated?)")
            header = json.loads(handle.read(size))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise WeightsError(f"{path} is not a .safetensors file (its header is not JSON; corrupt?)") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path} is not a .safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    end = max((int(entry["data_offsets"][1]) for entry in header.values() if isinstance(entry, dict)), default=0)
    if 8 + size + end > file_size:
        raise WeightsError(f"{path} is truncated: its header needs {8 + size + end} bytes, the file has {file_size}")
    return header


def check_torch_file(path: Path) -> None:
    """Fail unless ``path`` starts like a torch.save file (a zip archive, or the legacy pickle)."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return
    shown = head.decode("latin-1").encode("unicode_escape").decode() or "nothing"
    raise WeightsError(f"{path} is not a torch .pt file (it starts with {shown!r}, not a zip archive or a pickle)")


def folder_weight_files(folder: Path) -> list[Path]:
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


def _is_diffusers_config(data: Mapping[str, Any]) -> bool:
    return data.get("_class_name") == "WanTransformer3DModel" or "num_attention_heads" in data


def detect_format(path: str | Path) -> str:
    """'wan', 'self_forcing' or 'diffusers', from the files at ``path``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"weights path {str(path)!r} does not exist")
    if path.is_file():
        if path.suffix in TORCH_SUFFIXES:
            return "self_forcing"
        if path.suffix == ".safetensors":
            keys = safetensors_header(path)
            return "diffusers" if any(k.startswith("condition_embedder.") for k in keys) else "wan"
        raise WeightsError(f"cannot tell the format of {path}: expected a folder, .safetensors or .pt")
    folder = transformer_folder(path)
    config_path = folder / "config.json"
    if config_path.is_file():
        config = _read_json(config_path)
        if _is_diffusers_config(config):
            return "diffusers"
        if config.get("_class_name") == "WanModel" or "dim" in config:
            return "wan"
    keys = safetensors_header(folder_weight_files(folder)[0])
    return "diffusers" if any(k.startswith(("condition_embedder.", "blocks.0.attn1")) for k in keys) else "wan"


# -- model configs ---------------------------------------------------------------------------


def config_from_wan_json(data: Mapping[str, Any]) -> WanConfig:
    """WanConfig from an original Wan ``config.json`` (WanModel fields)."""
    keys = ("dim", "ffn_dim", "num_heads", "num_layers", "in_dim", "out_dim", "text_len", "freq_dim", "eps", "text_dim",
            "qk_norm", "cross_attn_norm")  # fmt: skip
    fields = {k: data[k] for k in keys if k in data}
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


def config_in_folder(folder: Path) -> WanConfig | None:
    """The model config a weights folder declares (config.json), or None."""
    folder = transformer_folder(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        return None
    data = _read_json(config_path)
    if _is_diffusers_config(data):
        return config_from_diffusers_json(data)
    config = config_from_wan_json(data)
    if "text_dim" not in data:
        # Wan's config.json leaves text_dim out; the weights' header knows it.
        width = _peek_shape(folder, "text_embedding.0.weight")
        if width is not None:
            config = dataclasses.replace(config, text_dim=width[1])
    return config


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
    where = ", ".join(str(f) for f in folders) or "no folder"
    raise FileNotFoundError(
        f"no umT5 text encoder found ({where}); set 'base' to the Wan2.1 release folder "
        f"(with {WAN_T5_FILE} and {WAN_TOKENIZER_DIR}/) or to a diffusers folder (text_encoder/, tokenizer/)"
    )


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """What every stage needs to know about a checkpoint, found once."""

    spec: CheckpointSpec
    format: str  # wan, self_forcing, diffusers or demo (never auto)
    weights: Path | None
    base: Path | None
    model_config: WanConfig
    lora: ResolvedLora | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def weight_files(self) -> list[Path]:
        """The files whose bytes are the weights (empty for the random demo)."""
        if self.weights is None:
            return []
        if self.weights.is_file():
            return [self.weights]
        folder = transformer_folder(self.weights)
        extra = [f for f in (folder / "config.json", *folder.glob("*.safetensors.index.json")) if f.is_file()]
        return sorted(folder_weight_files(folder) + extra)

    def text_encoder(self) -> TextEncoderSpec:
        """The prompt encoder of this checkpoint."""
        folders = [p for p in (self.base, self.weights) if p is not None]
        demo = self.format == "demo" or self.spec.model == "demo"
        return text_encoder_spec(folders, self.model_config, demo=demo)

    def digest(self, cache: str | Path | None = None) -> str:
        """sha256 of the weights' names and bytes; for the random demo, of what seeds them;
        with an adapter, of the weights' digest, the adapter's files and every module's scale."""
        if self.format == "demo":
            blob = json.dumps({"demo": self.model_config.to_dict(), "seed": self.spec.seed}, sort_keys=True)
            return hashlib.sha256(blob.encode()).hexdigest()
        weights = files_digest(self.weight_files(), cache)
        if self.lora is None:
            return weights  # as before adapters existed: nothing reruns
        # The scales depend on the config's lora.alpha as well as on the files.
        blob = json.dumps({"weights": weights, "lora": files_digest(self.lora.files(), cache), "scales": self.lora.scales()},
                          sort_keys=True)  # fmt: skip
        return hashlib.sha256(blob.encode()).hexdigest()


def resolve_checkpoint(spec: CheckpointSpec, base_dir: str | Path = ".") -> ResolvedCheckpoint:
    """Resolve a checkpoint entry, checking that its files exist and are what the format says.

    Raises ConfigError naming the ``checkpoints.<name>`` key and the problem.
    """
    try:
        return _resolve(spec, Path(base_dir))
    except _AdapterProblem as exc:
        raise ConfigError(f"config key checkpoints.{spec.name}.lora: {exc}") from None
    except (WeightsError, FileNotFoundError, KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise ConfigError(f"config key checkpoints.{spec.name}: {message}") from None


class _AdapterProblem(Exception):
    """A problem of the checkpoint's lora: adapter (named as its own config key)."""


def _resolve(spec: CheckpointSpec, base_dir: Path) -> ResolvedCheckpoint:
    if spec.format not in FORMATS:
        raise WeightsError(f"format {spec.format!r} is not one of {', '.join(FORMATS)}")
    if spec.format == "demo":
        if spec.weights:
            raise WeightsError("format 'demo' takes no weights file (it builds seeded random weights)")
        if spec.lora is not None:
            raise WeightsError("format 'demo' takes no lora adapter (its weights are seeded random weights)")
        return ResolvedCheckpoint(spec, "demo", None, None, get_model_config(spec.model or "demo"))
    weights = resolve_path(spec.weights, base_dir)
    if weights is None:
        raise WeightsError(f"format {spec.format!r} needs 'weights' (a file or folder)")
    if not weights.exists():
        raise FileNotFoundError(f"weights {spec.weights!r} do not exist (looked at {weights})")
    base = resolve_path(spec.base, base_dir)
    if base is not None and not base.is_dir():
        raise FileNotFoundError(f"base folder {spec.base!r} does not exist (looked at {base})")
    fmt = detect_format(weights) if spec.format == "auto" else spec.format
    _check_files(weights, fmt)
    if spec.model:
        config = get_model_config(spec.model)
    else:
        config = next(
            (found for folder in ([weights] if weights.is_dir() else []) + ([base] if base else [])
             if (found := config_in_folder(folder)) is not None),
            None,
        )  # fmt: skip
        if config is None:
            raise WeightsError(
                f"no model config for {fmt} weights {spec.weights!r}: set 'model' (e.g. wan2.1-t2v-1.3b) "
                "or 'base' (a Wan release folder with config.json)"
            )
    check_weights(weights, fmt, spec, config, base_dir)
    lora = None
    if spec.lora is not None:
        from sinkscope.model.lora import resolve_lora

        try:
            lora = resolve_lora(spec.lora, config, base_dir=base_dir, allow_pickle=spec.allow_pickle,
                                cache=base_dir / WEIGHT_CHECKS)  # fmt: skip
        except (WeightsError, FileNotFoundError, ValueError) as exc:
            raise _AdapterProblem(str(exc)) from None
    return ResolvedCheckpoint(spec, fmt, weights, base, config, lora)


def _check_files(weights: Path, fmt: str) -> None:
    """That the weights are what ``fmt`` says, from headers and first bytes only."""
    if fmt == "self_forcing":
        if weights.is_dir():
            raise WeightsError(f"format 'self_forcing' expects a .pt file, got the folder {weights}")
        check_torch_file(weights)
        return
    if fmt not in ("wan", "diffusers"):
        raise WeightsError(f"unknown weights format {fmt!r}")
    if weights.is_file():
        if weights.suffix != ".safetensors":
            raise WeightsError(f"format {fmt!r} expects a folder or .safetensors file, got {weights}")
        safetensors_header(weights)
        return
    for file in folder_weight_files(transformer_folder(weights)):
        safetensors_header(file)


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


def cached_value(key: str, cache: str | Path | None, compute) -> Any:
    """``compute()``, memoized under ``key`` in the JSON file ``cache`` (if given)."""
    store: dict[str, Any] = {}
    if cache is not None and Path(cache).is_file():
        try:
            store = json.loads(Path(cache).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            store = {}
    if key in store:
        return store[key]
    value = compute()
    if cache is not None:
        store[key] = value
        with atomic_path(cache) as tmp:
            tmp.write_text(json.dumps(store, indent=1))
    return value


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


def check_shapes(found: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]], source: str) -> None:
    """Strict key and shape comparison, failing with counts and the first names."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    mismatched = [f"{k} {tuple(found[k])} vs model {tuple(expected[k])}" for k in expected
                  if k in found and tuple(found[k]) != tuple(expected[k])]  # fmt: skip
    problems = [f"{len(names)} {label} (first: {', '.join(names[:4])})"
                for label, names in (("missing", missing), ("unexpected", unexpected), ("shape mismatches", mismatched))
                if names]  # fmt: skip
    if problems:
        raise WeightsError(f"{source} does not fit the model: " + "; ".join(problems))


def check_weights(weights: Path, fmt: str, spec: CheckpointSpec, config: WanConfig, base_dir: Path) -> None:
    """That the weights are whole and hold exactly the tensors the model needs, with their
    shapes, read from headers and the archive's pickle without torch and without
    unpickling (sinkscope.model.torchfile); cached by the files' sizes and mtimes."""
    files = [weights] if weights.is_file() else folder_weight_files(transformer_folder(weights))
    key = json.dumps([fmt, spec.ema, spec.allow_pickle, dataclasses.asdict(config),
                      [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]])  # fmt: skip
    cached_value(key, base_dir / WEIGHT_CHECKS, lambda: _check_weights(files, fmt, spec, config) or "ok")


def _check_weights(files: list[Path], fmt: str, spec: CheckpointSpec, config: WanConfig) -> None:
    from sinkscope.model.config import parameter_shapes
    from sinkscope.model.torchfile import read_archive, tensor_shapes

    expected = parameter_shapes(config)
    if fmt == "self_forcing":
        path = files[0]
        with open(path, "rb") as handle:
            if handle.read(4) != b"PK\x03\x04":
                return  # torch's pre-1.6 format: only torch.load can index it
        archive = read_archive(path, verify=True)
        if archive.unsafe_globals and not spec.allow_pickle:
            raise WeightsError(
                f"{path} holds pickled objects beyond tensors ({', '.join(archive.unsafe_globals[:3])}); set "
                "allow_pickle: true only for a file you trust"
            )
        data = archive.data
        if not isinstance(data, dict):
            raise WeightsError(f"{path} holds a {type(data).__name__}, not a dict of state dicts")
        wanted = "generator_ema" if spec.ema else "generator"
        if wanted in data:
            state = tensor_shapes(data[wanted])
            if state is None:
                raise WeightsError(f"{path}: {wanted!r} is not a state dict of tensors")
        elif any(k in data for k in ("generator", "generator_ema")):
            present = [k for k in ("generator", "generator_ema") if k in data]
            option = "ema: false" if wanted == "generator_ema" else "ema: true"
            raise WeightsError(f"{path} has no {wanted!r} (it has {present}); set {option} to load the other")
        else:
            state = tensor_shapes(data)
            if state is None:
                keys = ", ".join(map(str, list(data)[:8]))
                raise WeightsError(f"{path} has neither 'generator_ema' nor 'generator' (keys: {keys})")
        state = {k.replace(FSDP_WRAPPER, ""): v for k, v in state.items()}
        for prefix in ("model.", "_orig_mod."):
            if state and all(k.startswith(prefix) for k in state):
                state = {k[len(prefix) :]: v for k, v in state.items()}
        check_shapes(state, expected, str(path))
        return
    found: dict[str, tuple[int, ...]] = {}
    for file in files:
        for name, entry in safetensors_header(file).items():
            if isinstance(entry, dict) and "shape" in entry:
                found[name] = tuple(int(s) for s in entry["shape"])
    if fmt == "diffusers":
        found = {diffusers_to_wan_key(k): v for k, v in found.items() if not k.startswith("rope.")}
    elif found and all(k.startswith("model.diffusion_model.") for k in found):
        found = {k[len("model.diffusion_model.") :]: v for k, v in found.items()}
    check_shapes(found, expected, str(files[0]) if len(files) == 1 else f"the weights in {files[0].parent}")

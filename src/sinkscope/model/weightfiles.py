"""The files weights come in, opened without torch where that is enough.

Shared by the weight formats (``sinkscope.model.formats``), the checkpoint check
(``sinkscope.model.checkpoints``) and LoRA adapters (``sinkscope.model.lora``):
config paths (``sinkscope:NAME`` names a file shipped in the package), safetensors
headers read as JSON, the first bytes of a ``torch.save`` file, a folder's shards, a
JSON memo keyed by the files' sizes and mtimes, and the two torch-side readers
(safetensors and ``torch.load``), which import torch when called.
"""

from __future__ import annotations

import difflib
import json
import pickle
import re
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sinkscope.errors import WeightsError
from sinkscope.io import atomic_path

if TYPE_CHECKING:
    import torch

TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
PACKAGE_PREFIX = "sinkscope:"
PACKAGE_WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
# The name FSDP puts into a wrapped module's keys (model._fsdp_wrapped_module.blocks...);
# Self-Forcing-layout checkpoints saved from a wrapped model may carry it.
FSDP_WRAPPER = "_fsdp_wrapped_module."


# -- paths -----------------------------------------------------------------------------------


def resolve_path(path: str | None, base_dir: str | Path = ".") -> Path | None:
    """A config path: ``sinkscope:NAME`` is a file shipped in the package; relative paths
    resolve from ``base_dir`` (the workflow's working directory)."""
    if path is None:
        return None
    if path.startswith(PACKAGE_PREFIX):
        return PACKAGE_WEIGHTS / path[len(PACKAGE_PREFIX) :]
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base_dir) / p


def shipped_weights() -> list[str]:
    """The ``sinkscope:`` names of the weights shipped in the package."""
    return sorted(
        PACKAGE_PREFIX + p.name for p in PACKAGE_WEIGHTS.iterdir() if p.is_file() and p.suffix in TORCH_SUFFIXES
    )


def missing_path(message: str, text: str) -> str:
    """``message`` (one line: the config path ``text`` is missing), and for a
    ``sinkscope:`` name that is not shipped, the shipped ones (the closest first)."""
    if not text.startswith(PACKAGE_PREFIX):
        return message
    shipped = shipped_weights()
    close = difflib.get_close_matches(text, shipped, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{message}; {hint}the package ships {', '.join(shipped) or 'no weights'}"


# -- headers, first bytes, folders -------------------------------------------------------------


def read_json(path: Path) -> dict:
    try:
        with open(path) as handle:
            data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise WeightsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: expected a JSON object")
    return data


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


def safetensors_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` over the headers of ``files``."""
    found: dict[str, tuple[int, ...]] = {}
    for file in files:
        for name, entry in safetensors_header(file).items():
            if isinstance(entry, dict) and "shape" in entry:
                found[name] = tuple(int(s) for s in entry["shape"])
    return found


def check_torch_file(path: Path) -> None:
    """Fail unless ``path`` starts like a torch.save file (a zip archive, or the legacy pickle)."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return
    shown = head.decode("latin-1").encode("unicode_escape").decode() or "nothing"
    raise WeightsError(f"{path} is not a torch .pt file (it starts with {shown!r}, not a zip archive or a pickle)")


def transformer_folder(path: Path) -> Path:
    """A diffusers pipeline folder keeps the transformer under transformer/."""
    sub = path / "transformer"
    return sub if (sub / "config.json").is_file() else path


def folder_weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder, in the order an index names them."""
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        weight_map = read_json(indexes[0]).get("weight_map", {})
        files = sorted({folder / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{indexes[0]} names shards that do not exist: {', '.join(missing[:3])}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in folder {folder}")
    return files


def strip_wrappers(state: Mapping[str, Any], prefixes: tuple[str, ...] = ("model.", "_orig_mod.")) -> dict[str, Any]:
    """Keys without FSDP's wrapper name and, in turn, each prefix every key shares (a
    training wrapper's ``model.``, torch.compile's ``_orig_mod.``)."""
    state = {key.replace(FSDP_WRAPPER, ""): value for key, value in state.items()}
    for prefix in prefixes:
        if state and all(key.startswith(prefix) for key in state):
            state = {key[len(prefix) :]: value for key, value in state.items()}
    return state


def check_shapes(found: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]], source: str) -> None:
    """Strict key and shape comparison, failing with counts and the first names."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    mismatched = [
        f"{k} {tuple(found[k])} vs model {tuple(expected[k])}"
        for k in expected
        if k in found and tuple(found[k]) != tuple(expected[k])
    ]
    problems = [
        f"{len(names)} {label} (first: {', '.join(names[:4])})"
        for label, names in (("missing", missing), ("unexpected", unexpected), ("shape mismatches", mismatched))
        if names
    ]
    if problems:
        raise WeightsError(f"{source} does not fit the model: " + "; ".join(problems))


# -- a memo of what reading files found ----------------------------------------------------------


def cached_value(key: str, cache: str | Path | None, compute: Callable[[], Any]) -> Any:
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


# -- the torch side (torch is imported when these are called) ----------------------------------


def safe_open(path: Path, **options: Any):
    """safetensors' safe_open, with a corrupt or truncated file named in a WeightsError."""
    from safetensors import safe_open as open_safetensors

    safetensors_header(path)  # a clear message for files that are not safetensors
    try:
        return open_safetensors(str(path), framework="pt", **options)
    except Exception as exc:  # noqa: BLE001 - SafetensorError is not a common base class
        raise WeightsError(f"{path} is not a readable .safetensors file (corrupt or truncated?): {exc}") from None


def load_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of ``files``, memory-mapped (read when touched)."""
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(file, device="cpu") as handle:
            for key in handle.keys():
                state[key] = handle.get_tensor(key)
    return state


def torch_load(path: Path, *, allow_pickle: bool, option: str = "allow_pickle: true") -> Any:
    """torch.load, memory-mapped, refusing to unpickle code unless allowed.

    ``option`` names the setting that allows unpickling, for the error message.
    """
    import torch

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
            raise WeightsError(
                f"{path} is not a readable torch file (corrupt or truncated?): {_plain(str(exc))[:200]}"
            ) from None
        raise WeightsError(
            f"{path} holds objects beyond tensors, and unpickling them is refused by default "
            f"(it can run code); if you trust the file, set {option} ({_plain(str(exc).splitlines()[0])[:120]})"
        ) from None


def _plain(text: str) -> str:
    """Without terminal escape codes (torch bolds parts of its messages)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)

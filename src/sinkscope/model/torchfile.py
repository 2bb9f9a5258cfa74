"""What a ``torch.save`` file holds, read without torch and without unpickling.

A ``.pt`` file written by ``torch.save`` is a zip archive: ``<prefix>/data.pkl`` (the
object, pickled; every tensor a persistent reference to a storage record) beside one
record per storage (``<prefix>/data/<key>``). ``read_archive`` walks the pickle's
opcodes with a small stack machine that builds containers, strings and numbers and
stands in for everything else (a tensor becomes ``TensorInfo`` with its shape; any
other object becomes ``PickledObject`` naming its class), so the config check can tell,
before any job runs and without executing a byte of the file:

- whether the archive is whole (its directory, and with ``verify`` every record's CRC);
- which objects beyond tensors it would unpickle (what ``torch.load(weights_only=True)``
  refuses);
- its key structure and every tensor's shape (a generator-less checkpoint, or weights
  of another model, fail here, naming the key).
"""

from __future__ import annotations

import pickletools
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sinkscope.errors import WeightsError

# The globals a weights-only load accepts: tensor and storage rebuilders, storage and
# dtype names, ordered dicts. Anything else is a pickled object.
_SAFE_MODULES = ("torch._utils", "torch.storage", "torch._tensor")
_SAFE_GLOBALS = {"collections.OrderedDict", "builtins.set", "builtins.frozenset", "_codecs.encode", "torch.Size",
                 "torch.device"}  # fmt: skip
_TENSOR_REBUILDERS = {"torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor", "torch._utils._rebuild_parameter",
                      "torch._utils._rebuild_parameter_with_state"}  # fmt: skip


@dataclass(frozen=True)
class TensorInfo:
    """A tensor in the pickle: its shape (the storage is not read)."""

    shape: tuple[int, ...]


@dataclass(frozen=True)
class PickledObject:
    """An object the pickle would construct by calling ``name`` (never called here)."""

    name: str


@dataclass(frozen=True)
class _Global:
    name: str


@dataclass(frozen=True)
class _Storage:
    key: str


class _Mark:
    pass


@dataclass(frozen=True)
class Archive:
    """What a torch.save archive holds: the object (dicts, lists, ``TensorInfo`` and
    ``PickledObject`` stand-ins) and the globals its pickle names."""

    path: Path
    data: Any
    globals: frozenset[str]

    @property
    def unsafe_globals(self) -> list[str]:
        """Globals a weights-only load refuses: classes and functions beyond tensors."""
        return sorted(name for name in self.globals if not _is_safe(name))


def _is_safe(name: str) -> bool:
    module, _, attribute = name.rpartition(".")
    if name in _SAFE_GLOBALS or module in _SAFE_MODULES:
        return True
    # torch.FloatStorage, torch.float32, ... (storage classes and dtypes)
    return module == "torch" and (attribute.endswith("Storage") or attribute in _DTYPES)


_DTYPES = {"float32", "float", "float64", "double", "float16", "half", "bfloat16", "int64", "long", "int32", "int",
           "int16", "short", "int8", "uint8", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"}  # fmt: skip


def read_archive(path: str | Path, *, verify: bool = False) -> Archive:
    """Read the object structure of a torch.save zip archive; ``verify`` also checks the
    CRC of every record (reads the whole file). Raises WeightsError naming the file."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [name for name in names if name.endswith("data.pkl")]
            if len(pickles) != 1:
                raise WeightsError(f"{path} is not a torch.save archive (it holds {len(pickles)} data.pkl records)")
            if verify:
                broken = archive.testzip()
                if broken is not None:
                    raise WeightsError(f"{path} is corrupt: record {broken!r} fails its CRC check (damaged or bit-flipped)")
            prefix = pickles[0][: -len("data.pkl")]
            storages = {name[len(prefix) + len("data/") :] for name in names if name.startswith(prefix + "data/")}
            payload = archive.read(pickles[0])
    except zipfile.BadZipFile as exc:
        raise WeightsError(f"{path} is not a whole zip archive ({exc}); truncated or damaged?") from None
    except (OSError, EOFError) as exc:
        raise WeightsError(f"{path} cannot be read as a zip archive ({exc}); truncated or damaged?") from None
    data, found = _unpickle_structure(payload, path)
    missing = sorted({s.key for s in found["storages"]} - storages)
    if missing:
        raise WeightsError(f"{path} is incomplete: its pickle refers to storage records it lacks ({', '.join(missing[:3])})")
    return Archive(path, data, frozenset(found["globals"]))


def _unpickle_structure(payload: bytes, path: Path) -> tuple[Any, dict[str, set]]:
    """Run the pickle's opcodes on stand-ins: containers and scalars are built, calls are not."""
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    found: dict[str, set] = {"globals": set(), "storages": set()}

    def pop_mark() -> list[Any]:
        for index in range(len(stack) - 1, -1, -1):
            if isinstance(stack[index], _Mark):
                items = stack[index + 1 :]
                del stack[index:]
                return items
        raise ValueError("MARK missing")

    def call(function: Any, args: Any) -> Any:
        name = function.name if isinstance(function, _Global) else repr(function)
        if name in _TENSOR_REBUILDERS and isinstance(args, tuple) and args:
            if isinstance(args[0], TensorInfo):  # a parameter wraps a tensor
                return args[0]
            shape = args[2] if len(args) > 2 and isinstance(args[2], tuple) else ()
            return TensorInfo(tuple(int(s) for s in shape if isinstance(s, int)))
        if name == "collections.OrderedDict":
            return {}
        if name == "torch.Size" and isinstance(args, tuple) and args:
            return tuple(args[0])
        if name == "_codecs.encode" and isinstance(args, tuple) and args:
            return str(args[0]).encode("latin-1")
        return PickledObject(name)

    try:
        for opcode, arg, _ in pickletools.genops(payload):
            op = opcode.name
            if op in ("PROTO", "FRAME", "STOP"):
                continue
            if op == "MARK":
                stack.append(_Mark())
            elif op in ("EMPTY_DICT",):
                stack.append({})
            elif op in ("EMPTY_LIST",):
                stack.append([])
            elif op == "EMPTY_TUPLE":
                stack.append(())
            elif op in ("EMPTY_SET",):
                stack.append(set())
            elif op == "DICT":
                items = pop_mark()
                stack.append({_key(items[i]): items[i + 1] for i in range(0, len(items), 2)})
            elif op == "LIST":
                stack.append(pop_mark())
            elif op == "TUPLE":
                stack.append(tuple(pop_mark()))
            elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
                count = int(op[-1])
                items = stack[-count:]
                del stack[-count:]
                stack.append(tuple(items))
            elif op == "SETITEM":
                value, key = stack.pop(), stack.pop()
                if isinstance(stack[-1], dict):
                    stack[-1][_key(key)] = value
            elif op == "SETITEMS":
                items = pop_mark()
                if isinstance(stack[-1], dict):
                    stack[-1].update({_key(items[i]): items[i + 1] for i in range(0, len(items), 2)})
            elif op == "APPEND":
                value = stack.pop()
                if isinstance(stack[-1], list):
                    stack[-1].append(value)
            elif op == "APPENDS":
                items = pop_mark()
                if isinstance(stack[-1], list):
                    stack[-1].extend(items)
            elif op == "ADDITEMS":
                items = pop_mark()
                if isinstance(stack[-1], set):
                    stack[-1].update(_key(item) for item in items)
            elif op in ("NONE",):
                stack.append(None)
            elif op in ("NEWTRUE", "NEWFALSE"):
                stack.append(op == "NEWTRUE")
            elif op in ("GLOBAL",):
                module, name = arg.split(" ", 1) if " " in arg else arg.split("\n", 1)
                found["globals"].add(f"{module}.{name}")
                stack.append(_Global(f"{module}.{name}"))
            elif op == "STACK_GLOBAL":
                name, module = stack.pop(), stack.pop()
                found["globals"].add(f"{module}.{name}")
                stack.append(_Global(f"{module}.{name}"))
            elif op == "REDUCE":
                args, function = stack.pop(), stack.pop()
                stack.append(call(function, args))
            elif op == "NEWOBJ":
                args, cls = stack.pop(), stack.pop()
                stack.append(call(cls, args))
            elif op == "NEWOBJ_EX":
                _, args, cls = stack.pop(), stack.pop(), stack.pop()
                stack.append(call(cls, args))
            elif op == "BUILD":
                stack.pop()  # the object's state: not applied to stand-ins
            elif op == "BINPERSID":
                pid = stack.pop()
                key = str(pid[2]) if isinstance(pid, tuple) and len(pid) > 2 else str(pid)
                storage = _Storage(key)
                found["storages"].add(storage)
                stack.append(storage)
            elif op == "PERSID":
                storage = _Storage(str(arg))
                found["storages"].add(storage)
                stack.append(storage)
            elif op in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif op == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif op in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif op == "POP":
                stack.pop()
            elif op == "POP_MARK":
                pop_mark()
            elif op == "DUP":
                stack.append(stack[-1])
            elif opcode.arg is not None:
                stack.append(arg)  # strings, bytes, ints, floats
            else:
                raise ValueError(f"opcode {op} is not supported")
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise WeightsError(f"{path}: its data.pkl cannot be read ({exc}); damaged?") from None
    if len(stack) != 1:
        raise WeightsError(f"{path}: its data.pkl does not describe one object; damaged?")
    return stack[0], found


def _key(value: Any) -> Any:
    """A dict key of the stand-in structure (unhashable keys become their repr)."""
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def tensor_shapes(mapping: Any) -> dict[str, tuple[int, ...]] | None:
    """``{name: shape}`` when ``mapping`` is a state dict (string keys to tensors), else None."""
    if not isinstance(mapping, dict) or not mapping:
        return None
    if not all(isinstance(key, str) and isinstance(value, TensorInfo) for key, value in mapping.items()):
        return None
    return {key: value.shape for key, value in mapping.items()}

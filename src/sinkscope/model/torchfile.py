"""What a ``torch.save`` file holds, read without torch and without unpickling.

A ``.pt`` file written by ``torch.save`` is a zip archive: ``<prefix>/data.pkl`` (the
object, pickled; every tensor a persistent reference to a storage record) beside one
record per storage (``<prefix>/data/<key>``). ``read_archive`` walks the pickle's
opcodes with a small stack machine that builds containers, strings and numbers and
stands in for everything else (a tensor becomes ``TensorInfo`` with its shape; any
other object becomes ``PickledObject`` naming its class), so the config check can tell,
before any job runs and without executing a byte of the file:

- whether the archive is whole (its directory, and with ``verify`` every record's CRC);
  a file in torch's legacy format (before 1.6: a stream of pickles followed by the
  storages' bytes) is walked the same way, each storage's length checked against the file;
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
from typing import Any, BinaryIO

from sinkscope.errors import WeightsError

# The globals a weights-only load accepts: tensor and storage rebuilders, storage and
# dtype names, ordered dicts. Anything else is a pickled object.
_SAFE_MODULES = ("torch._utils", "torch.storage", "torch._tensor")
_SAFE_GLOBALS = {
    "collections.OrderedDict",
    "builtins.set",
    "builtins.frozenset",
    "_codecs.encode",
    "torch.Size",
    "torch.device",
}
_TENSOR_REBUILDERS = {
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state",
}


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
    type_name: str = ""  # torch.FloatStorage, ... (the legacy format needs it to size a record)


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


_DTYPES = {
    "float32",
    "float",
    "float64",
    "double",
    "float16",
    "half",
    "bfloat16",
    "int64",
    "long",
    "int32",
    "int",
    "int16",
    "short",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
}


def read_archive(path: str | Path, *, verify: bool = False) -> Archive:
    """Read the object structure of a torch.save file: a zip archive (``verify`` also
    checks the CRC of every record, reading the whole file) or torch's legacy format.
    Raises WeightsError naming the file."""
    path = Path(path)
    with open(path, "rb") as handle:
        if handle.read(4) != b"PK\x03\x04":
            return _read_legacy(path)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [name for name in names if name.endswith("data.pkl")]
            if len(pickles) != 1:
                raise WeightsError(f"{path} is not a torch.save archive (it holds {len(pickles)} data.pkl records)")
            if verify:
                broken = archive.testzip()
                if broken is not None:
                    raise WeightsError(
                        f"{path} is corrupt: record {broken!r} fails its CRC check (damaged or bit-flipped)"
                    )
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
        raise WeightsError(
            f"{path} is incomplete: its pickle refers to storage records it lacks ({', '.join(missing[:3])})"
        )
    return Archive(path, data, frozenset(found["globals"]))


def read_trusted_structure(path: str | Path, *, allow_pickle: bool, option: str = "allow_pickle: true") -> Any:
    """The object structure of a torch.save file, verified whole; one that would unpickle
    objects beyond tensors is refused unless ``allow_pickle`` (``option`` names the setting)."""
    archive = read_archive(path, verify=True)
    if archive.unsafe_globals and not allow_pickle:
        raise WeightsError(
            f"{archive.path} holds pickled objects beyond tensors ({', '.join(archive.unsafe_globals[:3])}); "
            f"set {option} only for a file you trust"
        )
    return archive.data


# torch.serialization's legacy format: the magic number, the protocol version and the
# system info, each pickled; the object; the sorted storage keys; then per key the
# storage's element count (int64, little-endian) and its bytes.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
_ELEMENT_SIZES = {
    "Double": 8,
    "Float": 4,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "Untyped": 1,
}


def _read_legacy(path: Path) -> Archive:
    """A legacy-format torch.save file, walked without unpickling: its pickles, and that
    every storage the object refers to is there, as long as its element count says."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        for expected in (LEGACY_MAGIC, LEGACY_PROTOCOL, dict):
            value = _unpickle_structure(handle, path)[0]
            if not (isinstance(value, expected) if isinstance(expected, type) else value == expected):
                raise WeightsError(f"{path} is not a torch.save file (it starts with a pickle, but not torch's header)")
        data, found = _unpickle_structure(handle, path)
        keys, _ = _unpickle_structure(handle, path)
        if not isinstance(keys, list):
            raise WeightsError(f"{path}: its list of storages cannot be read; damaged?")
        types = {s.key: s.type_name for s in found["storages"]}
        missing = sorted(set(types) - {str(k) for k in keys})
        if missing:
            raise WeightsError(
                f"{path} is incomplete: its pickle refers to storages it lacks ({', '.join(missing[:3])})"
            )
        for key in keys:
            raw = handle.read(8)
            if len(raw) < 8:
                raise WeightsError(f"{path} is truncated: storage {key!r} is missing")
            element = _ELEMENT_SIZES.get(types.get(str(key), "").rpartition(".")[2].removesuffix("Storage"))
            if element is None:
                break  # a storage type sized here by no table: the records after it cannot be found
            end = handle.tell() + int.from_bytes(raw, "little", signed=True) * element
            if not handle.tell() <= end <= size:
                raise WeightsError(f"{path} is truncated: storage {key!r} needs {end} bytes, the file has {size}")
            handle.seek(end)
    return Archive(path, data, frozenset(found["globals"]))


def _unpickle_structure(payload: bytes | BinaryIO, path: Path) -> tuple[Any, dict[str, set]]:
    """Run the pickle's opcodes on stand-ins: containers and scalars are built, calls are not.

    ``payload`` is the pickle's bytes, or a file positioned at one (left after its STOP)."""
    machine = _StandInMachine()
    try:
        for opcode, arg, _ in pickletools.genops(payload):
            machine.step(opcode, arg)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise WeightsError(f"{path}: its pickle cannot be read ({exc}); truncated or damaged?") from None
    if len(machine.stack) != 1:
        raise WeightsError(f"{path}: its pickle does not describe one object; truncated or damaged?")
    return machine.stack[0], machine.found


class _StandInMachine:
    """The pickle machine's stack and memo, with stand-ins for what would be called: one
    method per family of opcodes (``step`` dispatches), the globals and storages it met in
    ``found``."""

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}
        self.found: dict[str, set] = {"globals": set(), "storages": set()}
        self._ops = {
            **dict.fromkeys(("PROTO", "FRAME", "STOP"), lambda op, arg: None),
            "MARK": lambda op, arg: self.stack.append(_Mark()),
            "EMPTY_DICT": lambda op, arg: self.stack.append({}),
            "EMPTY_LIST": lambda op, arg: self.stack.append([]),
            "EMPTY_TUPLE": lambda op, arg: self.stack.append(()),
            "EMPTY_SET": lambda op, arg: self.stack.append(set()),
            "NONE": lambda op, arg: self.stack.append(None),
            **dict.fromkeys(("NEWTRUE", "NEWFALSE"), lambda op, arg: self.stack.append(op == "NEWTRUE")),
            **dict.fromkeys(("DICT", "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"), self._container),
            **dict.fromkeys(("SETITEM", "SETITEMS", "APPEND", "APPENDS", "ADDITEMS"), self._fill),
            **dict.fromkeys(("GLOBAL", "STACK_GLOBAL"), self._global),
            **dict.fromkeys(("REDUCE", "NEWOBJ", "NEWOBJ_EX"), self._call),
            "BUILD": lambda op, arg: self.stack.pop(),  # the object's state: not applied to stand-ins
            **dict.fromkeys(("BINPERSID", "PERSID"), self._storage),
            **dict.fromkeys(
                ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET", "POP", "POP_MARK", "DUP"),
                self._memo_and_stack,
            ),
        }

    def step(self, opcode: pickletools.OpcodeInfo, arg: Any) -> None:
        run = self._ops.get(opcode.name)
        if run is not None:
            run(opcode.name, arg)
        elif opcode.arg is not None:
            self.stack.append(arg)  # strings, bytes, ints, floats
        else:
            raise ValueError(f"opcode {opcode.name} is not supported")

    def _pop_mark(self) -> list[Any]:
        stack = self.stack
        for index in range(len(stack) - 1, -1, -1):
            if isinstance(stack[index], _Mark):
                items = stack[index + 1 :]
                del stack[index:]
                return items
        raise ValueError("MARK missing")

    def _container(self, op: str, arg: Any) -> None:
        if op == "DICT":
            items = self._pop_mark()
            self.stack.append({_key(items[i]): items[i + 1] for i in range(0, len(items), 2)})
        elif op == "LIST":
            self.stack.append(self._pop_mark())
        elif op == "TUPLE":
            self.stack.append(tuple(self._pop_mark()))
        else:  # TUPLE1, TUPLE2, TUPLE3
            count = int(op[-1])
            items = self.stack[-count:]
            del self.stack[-count:]
            self.stack.append(tuple(items))

    def _fill(self, op: str, arg: Any) -> None:
        """Items into the container below them (ignored where a stand-in is no container)."""
        if op in ("SETITEM", "APPEND"):
            items = [self.stack.pop()] if op == "APPEND" else [self.stack.pop(-2), self.stack.pop()]
        else:
            items = self._pop_mark()
        target = self.stack[-1]
        if op.startswith("SETITEM") and isinstance(target, dict):
            target.update({_key(items[i]): items[i + 1] for i in range(0, len(items), 2)})
        elif op.startswith("APPEND") and isinstance(target, list):
            target.extend(items)
        elif op == "ADDITEMS" and isinstance(target, set):
            target.update(_key(item) for item in items)

    def _global(self, op: str, arg: Any) -> None:
        if op == "GLOBAL":
            module, name = arg.split(" ", 1) if " " in arg else arg.split("\n", 1)
        else:
            name, module = self.stack.pop(), self.stack.pop()
        self.found["globals"].add(f"{module}.{name}")
        self.stack.append(_Global(f"{module}.{name}"))

    def _call(self, op: str, arg: Any) -> None:
        """A call's stand-in: a tensor's shape, a container, bytes, or the class it would make."""
        if op == "NEWOBJ_EX":
            self.stack.pop()  # keyword arguments
        args, function = self.stack.pop(), self.stack.pop()
        name = function.name if isinstance(function, _Global) else repr(function)
        if name in _TENSOR_REBUILDERS and isinstance(args, tuple) and args:
            if isinstance(args[0], TensorInfo):  # a parameter wraps a tensor
                result = args[0]
            else:
                shape = args[2] if len(args) > 2 and isinstance(args[2], tuple) else ()
                result = TensorInfo(tuple(int(s) for s in shape if isinstance(s, int)))
        elif name == "collections.OrderedDict":
            result = {}
        elif name == "torch.Size" and isinstance(args, tuple) and args:
            result = tuple(args[0])
        elif name == "_codecs.encode" and isinstance(args, tuple) and args:
            result = str(args[0]).encode("latin-1")
        else:
            result = PickledObject(name)
        self.stack.append(result)

    def _storage(self, op: str, arg: Any) -> None:
        if op == "PERSID":
            storage = _Storage(str(arg))
        else:
            pid = self.stack.pop()
            key = str(pid[2]) if isinstance(pid, tuple) and len(pid) > 2 else str(pid)
            kind = pid[1].name if isinstance(pid, tuple) and len(pid) > 1 and isinstance(pid[1], _Global) else ""
            storage = _Storage(key, kind)
        self.found["storages"].add(storage)
        self.stack.append(storage)

    def _memo_and_stack(self, op: str, arg: Any) -> None:
        if op in ("PUT", "BINPUT", "LONG_BINPUT"):
            self.memo[arg] = self.stack[-1]
        elif op == "MEMOIZE":
            self.memo[len(self.memo)] = self.stack[-1]
        elif op in ("GET", "BINGET", "LONG_BINGET"):
            self.stack.append(self.memo[arg])
        elif op == "POP":
            self.stack.pop()
        elif op == "POP_MARK":
            self._pop_mark()
        else:  # DUP
            self.stack.append(self.stack[-1])


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

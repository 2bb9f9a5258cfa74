"""Edits applied while a video is generated (``generation.interventions``), as planning sees them.

Standard library only: the config check, the study plan and the jobs read the same
parsed edits. Four edits, each with its config name (``edit``) and canonical form
(``to_config()``: equal configs give equal rule params):

- ``mask_keys``: the chosen heads' queries do not see the chosen cached frames' keys;
- ``logit_bias``: ``bias`` is added to those scores (0.0 is the untouched video);
- ``quantize_cache``: the cache's earlier frames are stored in ``format`` and read back;
- ``replace_frames``: the cached keys and values of frames ``key_frames`` are those of
  ``source`` (``noise``, or an earlier frame) for the rest of the video.

Heads are ``all``, paper labels (``[L1H1, L5H10]``, 1-based as ``figures.heads``), layers
(``L5``: every head of layer 5), ``class:<head class>`` (the heads of that class in the
untouched ``default`` run of the same checkpoint; the job turns it into a list with
``with_head_classes`` before generating) or ``atlas:<sweep>:<order>:<k>`` (the first k
heads of a head atlas's order, ``sinkscope.sweeps``; the job turns it into a list with
``with_head_orders``). Key frames are absolute latent frames, ``sink`` or ``cached``. What
the model and the video must have is checked by ``sinkscope.pipeline.config``;
docs/interventions.md describes the edits.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sinkscope.errors import ConfigError, DamagedFileError, SinkscopeError, gathered
from sinkscope.io import atomic_path
from sinkscope.naming import HEAD_LABEL, head_label, layer_label, parse_head_label

# The KV-cache formats of ``sinkscope.model.quantize.CACHE_FORMATS`` (which imports torch;
# a test keeps the two equal) and the tensors a cache edit may quantize.
CACHE_FORMAT_NAMES = ("int8", "int4", "fp8_e4m3", "nvfp4", "nvfp4_4over6")
CACHE_TENSORS = ("k", "v", "both")
# The head labels of ``sinkscope.stats.summaries.HEAD_LABELS`` (a test keeps them equal):
# the classes, and the borderline labels ``sink?`` / ``local?``.
HEAD_CLASS_LABELS = ("sink", "sink?", "local", "local?", "periodic", "diffuse")
CLASS_PREFIX = "class:"
# random:<head class>[:<draw>]: the matched control of class:<head class> (``HeadSelection``).
RANDOM_PREFIX = "random:"
# atlas:<sweep>:<order>:<k>: the first k heads of a head atlas in one order (``sinkscope.sweeps``):
# least drift first, a seeded random order, least untouched frame-0 mass first.
ATLAS_PREFIX = "atlas:"
HEAD_ORDERS = ("drift", "random", "frame0_mass")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
LAYER_LABEL = re.compile(r"^L(\d+)$")
Head = tuple[int, int]


def _problem(where: str, message: str) -> ConfigError:
    return ConfigError(f"config key {where}: {message}")


def _did_you_mean(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# -- selections ------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadSelection:
    """Which heads an attention edit touches: ``all``; a ``list`` of heads (and of whole
    layers); a ``layer`` pattern (every head of ``layers``); a head ``class`` of the
    untouched run; ``random``, the matched control of a class: in each layer, as many
    heads as it has of ``head_class``, drawn among its other heads (a fixed draw for each
    ``draw`` number); or ``atlas``, the first ``count`` heads of head atlas ``atlas`` in
    ``order`` (``HEAD_ORDERS``). Layers and heads are 0-based."""

    kind: str
    heads: tuple[Head, ...] = ()
    layers: tuple[int, ...] = ()
    head_class: str | None = None
    draw: int = 0
    atlas: str | None = None
    order: str | None = None
    count: int = 0

    @property
    def by_class(self) -> bool:
        """Whether the heads come from the untouched run's classes (``class`` or ``random``)."""
        return self.kind in ("class", "random")

    @property
    def by_atlas(self) -> bool:
        """Whether the heads come from a head atlas's order (``atlas``)."""
        return self.kind == "atlas"

    def resolve(
        self,
        num_layers: int,
        num_heads: int,
        head_classes: Mapping[Head, str] | None = None,
        head_orders: Mapping[str, Mapping[str, Sequence[Head]]] | None = None,
    ) -> frozenset[Head]:
        """The (layer, head) pairs selected in a model of ``num_layers`` x ``num_heads``;
        a ``class`` selection needs the untouched run's ``head_classes``, an ``atlas`` one
        the ``head_orders`` of its atlas (sweep -> order -> heads, first to last)."""
        if self.kind == "all":
            return frozenset((layer, head) for layer in range(num_layers) for head in range(num_heads))
        if self.by_atlas:
            order = (head_orders or {}).get(str(self.atlas), {}).get(str(self.order))
            if order is None:
                raise SinkscopeError(f"heads {self.to_config()!r} need the head orders of atlas {self.atlas!r}")
            if self.count > len(order):
                raise SinkscopeError(
                    f"heads {self.to_config()!r}: atlas {self.atlas!r} orders {len(order)} heads, not {self.count}"
                )
            return frozenset(tuple(head) for head in order[: self.count])
        if self.by_class:
            if head_classes is None:
                raise SinkscopeError(f"heads {self.to_config()!r} need the head classes of the untouched run")
            if self.kind == "random":
                return _matched_heads(head_classes, str(self.head_class), self.draw)
            return frozenset(key for key, label in head_classes.items() if label == self.head_class)
        outside = self.problems(num_layers, num_heads)
        if outside:
            raise SinkscopeError(
                f"heads {', '.join(outside)} are not in a model of {num_layers} layers x {num_heads} heads"
            )
        selected = {(layer, head) for layer in self.layers for head in range(num_heads)}
        return frozenset(selected | set(self.heads))

    def problems(self, num_layers: int, num_heads: int) -> list[str]:
        """The labels of the selection a model of ``num_layers`` x ``num_heads`` lacks."""
        missing = [layer_label(layer) for layer in self.layers if layer >= num_layers]
        return missing + [head_label(*key) for key in self.heads if key[0] >= num_layers or key[1] >= num_heads]

    def to_config(self) -> str | list[str]:
        if self.kind == "all":
            return "all"
        if self.kind == "class":
            return CLASS_PREFIX + str(self.head_class)
        if self.kind == "random":
            return RANDOM_PREFIX + str(self.head_class) + (f":{self.draw}" if self.draw else "")
        if self.kind == "atlas":
            return f"{ATLAS_PREFIX}{self.atlas}:{self.order}:{self.count}"
        if self.kind == "layer" and len(self.layers) == 1:
            return layer_label(self.layers[0])
        labels = [(layer, -1, layer_label(layer)) for layer in self.layers]
        labels += [(layer, head, head_label(layer, head)) for layer, head in self.heads]
        return [label for *_, label in sorted(labels)]


def _matched_heads(head_classes: Mapping[Head, str], head_class: str, draw: int) -> frozenset[Head]:
    """Per layer, as many heads as it has of ``head_class``, among its heads of another
    class, ordered by a hash of (class, draw, layer, head): a fixed draw on every machine."""
    chosen: set[Head] = set()
    for layer in sorted({layer for layer, _ in head_classes}):
        heads = sorted(key for key in head_classes if key[0] == layer)
        wanted = sum(head_classes[key] == head_class for key in heads)
        others = [key for key in heads if head_classes[key] != head_class]
        others.sort(key=lambda key: hashlib.sha256(f"{head_class}:{draw}:{key[0]}:{key[1]}".encode()).hexdigest())
        chosen.update(others[:wanted])
    return frozenset(chosen)


@dataclass(frozen=True)
class FrameSelection:
    """Which cached frames an edit touches: a ``list`` of absolute latent frames, the
    policy's ``sink`` frames (frame 0 without a sink), or every ``cached`` frame (every
    frame before the current block)."""

    kind: str
    frames: tuple[int, ...] = ()

    def resolve(self, cached: Sequence[int], sink: Sequence[int]) -> tuple[int, ...]:
        """The selected frames among those ``cached`` now (``sink``: the policy's sink frames)."""
        chosen = {"list": set(self.frames), "sink": set(sink), "cached": set(cached)}[self.kind]
        return tuple(frame for frame in cached if frame in chosen)

    def to_config(self) -> str | list[int]:
        return list(self.frames) if self.kind == "list" else self.kind


# -- the edits -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MaskKeys:
    """The chosen heads' queries do not see keys of the chosen cached frames (-inf scores)."""

    heads: HeadSelection
    key_frames: FrameSelection
    edit: ClassVar[str] = "mask_keys"

    def to_config(self) -> dict[str, Any]:
        return {"edit": self.edit, "heads": self.heads.to_config(), "key_frames": self.key_frames.to_config()}


@dataclass(frozen=True)
class LogitBias:
    """``bias`` added to the chosen heads' scores of the chosen cached frames' keys."""

    heads: HeadSelection
    key_frames: FrameSelection
    bias: float
    edit: ClassVar[str] = "logit_bias"

    def __post_init__(self) -> None:
        object.__setattr__(self, "bias", float(self.bias) + 0.0)  # -0.0 and 0.0: one param

    def to_config(self) -> dict[str, Any]:
        return {
            "edit": self.edit,
            "heads": self.heads.to_config(),
            "key_frames": self.key_frames.to_config(),
            "bias": self.bias,
        }


@dataclass(frozen=True)
class QuantizeCache:
    """The cache's earlier frames stored in ``format`` and read back dequantized; ``tensors``:
    k, v or both."""

    format: str
    tensors: str = "both"
    edit: ClassVar[str] = "quantize_cache"

    def to_config(self) -> dict[str, Any]:
        return {"edit": self.edit, "format": self.format, "tensors": self.tensors}


@dataclass(frozen=True)
class ReplaceFrames:
    """The cached keys and values of ``key_frames`` replaced by ``source``'s: ``noise`` (a
    seeded random frame of the same statistics) or an earlier frame, for the rest of the video."""

    key_frames: FrameSelection
    source: str | int
    edit: ClassVar[str] = "replace_frames"

    def to_config(self) -> dict[str, Any]:
        return {"edit": self.edit, "key_frames": self.key_frames.to_config(), "source": self.source}


Edit = MaskKeys | LogitBias | QuantizeCache | ReplaceFrames
ATTENTION_EDITS = (MaskKeys, LogitBias)
CACHE_EDITS = (QuantizeCache, ReplaceFrames)
EDITS: dict[str, type] = {cls.edit: cls for cls in (*ATTENTION_EDITS, *CACHE_EDITS)}
# Each edit's keys beside ``edit``: (required, optional).
EDIT_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "mask_keys": (("heads", "key_frames"), ()),
    "logit_bias": (("heads", "key_frames", "bias"), ()),
    "quantize_cache": (("format",), ("tensors",)),
    "replace_frames": (("key_frames", "source"), ()),
}
ALL_KEYS = tuple(
    sorted({"edit", *(key for required, optional in EDIT_KEYS.values() for key in (*required, *optional))})
)


# -- parsing ---------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_int(value: Any) -> int | None:
    """An integer, or an integer-like string (``--config`` gives strings); None otherwise."""
    if _is_int(value):
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
        return int(value)
    return None


def _parse_atlas(value: str, where: str) -> HeadSelection:
    """``atlas:<sweep>:<order>:<k>``: the first k heads of a head atlas in one order."""
    parts = [part.strip() for part in value[len(ATLAS_PREFIX) :].split(":")]
    shape = f"atlas:<sweep>:<order>:<k> (orders: {', '.join(HEAD_ORDERS)})"
    if len(parts) != 3:
        raise _problem(where, f"{value!r} is not {shape}")
    sweep, order, count = parts[0], parts[1], _as_int(parts[2])
    if not NAME.match(sweep):
        raise _problem(where, f"{value!r}: {sweep!r} is not a sweep name; it is {shape}")
    if order not in HEAD_ORDERS:
        raise _problem(where, f"{value!r}: {order!r} is not an order{_did_you_mean(order, HEAD_ORDERS)}; it is {shape}")
    if count is None or count < 1:
        raise _problem(where, f"{value!r}: {parts[2]!r} is not a head count (1, 2, ...); it is {shape}")
    return HeadSelection("atlas", atlas=sweep, order=order, count=count)


def parse_heads(value: Any, where: str) -> HeadSelection:
    """``all``, ``class:<label>``, ``random:<label>``, ``atlas:<sweep>:<order>:<k>``, a
    label (``L1H1``, ``L5``) or a list of labels."""
    if isinstance(value, HeadSelection):
        return value
    if isinstance(value, str) and value.strip() == "all":
        return HeadSelection("all")
    if isinstance(value, str) and value.startswith(CLASS_PREFIX):
        name = value[len(CLASS_PREFIX) :].strip()
        if name not in HEAD_CLASS_LABELS:
            raise _problem(
                where,
                f"{value!r}: {name!r} is not a head class{_did_you_mean(name, HEAD_CLASS_LABELS)} "
                f"(classes: {', '.join(HEAD_CLASS_LABELS)})",
            )
        return HeadSelection("class", head_class=name)
    if isinstance(value, str) and value.startswith(RANDOM_PREFIX):
        name, _, draw = value[len(RANDOM_PREFIX) :].strip().partition(":")
        number = _as_int(draw or "0")
        if name not in HEAD_CLASS_LABELS or number is None or number < 0:
            guess = "" if name in HEAD_CLASS_LABELS else _did_you_mean(name, HEAD_CLASS_LABELS)
            raise _problem(
                where,
                f"{value!r} is not random:<head class> or random:<head class>:<draw number>{guess} "
                f"(classes: {', '.join(HEAD_CLASS_LABELS)})",
            )
        return HeadSelection("random", head_class=name, draw=number)
    if isinstance(value, str) and value.strip().startswith(ATLAS_PREFIX):
        return _parse_atlas(value.strip(), where)
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (list, tuple)) and not items:
        # No heads: a class the untouched run gave no head (``with_head_classes``); the
        # config schema refuses an empty list, so only a resolved selection reads so.
        return HeadSelection("list")
    if not isinstance(items, (list, tuple)):
        raise _problem(
            where,
            f"{value!r} is not 'all', 'class:<head class>', a head like 'L1H1', a layer like 'L5', or a list of them",
        )
    heads, layers = set(), set()
    for item in items:
        text = item.strip() if isinstance(item, str) else item
        head = HEAD_LABEL.match(text) if isinstance(text, str) else None
        layer = LAYER_LABEL.match(text) if isinstance(text, str) else None
        if head and int(head.group(1)) >= 1 and int(head.group(2)) >= 1:
            heads.add(parse_head_label(text))
        elif layer and int(layer.group(1)) >= 1:
            layers.add(int(layer.group(1)) - 1)
        else:
            hint = " or 'all'" if text in ("All", "ALL", "*") else ""
            raise _problem(
                where,
                f"{item!r} is not a head like 'L1H1' or a layer like 'L5'{hint}: labels are 1-based "
                "(L1H1 = layer 0, head 0)",
            )
    heads = {key for key in heads if key[0] not in layers}  # a listed layer holds them already
    if not heads:
        return HeadSelection("layer", layers=tuple(sorted(layers)))
    return HeadSelection("list", heads=tuple(sorted(heads)), layers=tuple(sorted(layers)))


def parse_frames(value: Any, where: str) -> FrameSelection:
    """``sink``, ``cached``, a frame, or a list of absolute latent frames."""
    if isinstance(value, FrameSelection):
        return value
    if isinstance(value, str) and value.strip() in ("sink", "cached"):
        return FrameSelection(value.strip())
    items = value if isinstance(value, (list, tuple)) else [value]
    frames = [_as_int(item) for item in items]
    if not items or any(frame is None or frame < 0 for frame in frames):
        bad = next((item for item, frame in zip(items, frames) if frame is None or frame < 0), value)
        guess = _did_you_mean(bad, ("sink", "cached")) if isinstance(bad, str) else ""
        raise _problem(
            where,
            f"{bad!r} is not a latent frame (0, 1, ...){guess}; key_frames is 'sink', 'cached' or a list of frames",
        )
    return FrameSelection("list", tuple(sorted(set(frames))))


def _parse_edit(item: Any, where: str) -> Edit:
    if isinstance(item, tuple(EDITS.values())):
        return item
    if not isinstance(item, Mapping):
        guess = _did_you_mean(item, EDITS) if isinstance(item, str) else ""
        raise _problem(
            where, f"{item!r} is not an edit like {{edit: mask_keys, heads: [L1H1], key_frames: [0]}}{guess}"
        )
    name = item.get("edit")
    if name is None:
        raise _problem(where, f"an edit needs 'edit' ({', '.join(EDITS)})")
    if name not in EDITS:
        raise _problem(f"{where}.edit", f"{name!r} is not one of {', '.join(EDITS)}{_did_you_mean(name, EDITS)}")
    required, optional = EDIT_KEYS[name]
    takes = (*required, *optional)
    for key in item:
        if key == "edit" or key in takes:
            continue
        if key in ALL_KEYS:
            owners = [edit for edit, (req, opt) in EDIT_KEYS.items() if key in (*req, *opt)]
            raise _problem(
                f"{where}.{key}",
                f"{name} takes no {key} (it takes {', '.join(takes)}; {key} belongs to {' and '.join(owners)})",
            )
        raise _problem(where, f"unknown key {key!r} for {name}{_did_you_mean(key, takes)}; it takes {', '.join(takes)}")
    missing = [key for key in required if item.get(key) is None]
    if missing:
        raise _problem(where, f"{name} needs {' and '.join(missing)} (it takes {', '.join(takes)})")
    if name in ("mask_keys", "logit_bias"):
        heads = parse_heads(item["heads"], f"{where}.heads")
        frames = parse_frames(item["key_frames"], f"{where}.key_frames")
        if name == "mask_keys":
            return MaskKeys(heads, frames)
        bias = item["bias"]
        if isinstance(bias, str):
            try:
                bias = float(bias)
            except ValueError:
                pass
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise _problem(f"{where}.bias", f"{item['bias']!r} is not a finite number (mask_keys removes keys)")
        return LogitBias(heads, frames, bias)
    if name == "quantize_cache":
        fmt, tensors = item["format"], item.get("tensors") or "both"
        if fmt not in CACHE_FORMAT_NAMES:
            raise _problem(
                f"{where}.format",
                f"{fmt!r} is not one of {', '.join(CACHE_FORMAT_NAMES)}{_did_you_mean(fmt, CACHE_FORMAT_NAMES)}",
            )
        if tensors not in CACHE_TENSORS:
            raise _problem(f"{where}.tensors", f"{tensors!r} is not one of {', '.join(CACHE_TENSORS)}")
        return QuantizeCache(fmt, tensors)
    frames = parse_frames(item["key_frames"], f"{where}.key_frames")
    source = item["source"]
    number = _as_int(source)
    if isinstance(source, str) and source.strip() == "noise":
        source = "noise"
    elif number is not None and number >= 0:
        source = number
    else:
        raise _problem(
            f"{where}.source", f"{source!r} is not 'noise' or a latent frame{_did_you_mean(source, ['noise'])}"
        )
    return ReplaceFrames(frames, source)


def parse_interventions(value: Any, where: str) -> tuple[Edit, ...]:
    """The edits of a config value (a list of mappings; parsed edits pass through); a
    ``ConfigError`` listing every bad edit, each line naming ``where[index].key``,
    otherwise. None and [] are no edits."""
    if value is None:
        return ()
    items = [value] if isinstance(value, (Mapping, *EDITS.values())) else value
    if isinstance(items, str) or not isinstance(items, (list, tuple)):
        raise _problem(
            where, f"{value!r} is not a list of edits like {{edit: mask_keys, heads: [L1H1], key_frames: [0]}}"
        )
    parsed, problems = [], []
    for index, item in enumerate(items):
        with gathered(problems):
            parsed.append(_parse_edit(item, f"{where}[{index}]"))
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError.invalid(problems)
    edits = tuple(parsed)
    quantized = [index for index, edit in enumerate(edits) if isinstance(edit, QuantizeCache)]
    if len(quantized) > 1:
        raise _problem(
            f"{where}[{quantized[1]}]", "a second quantize_cache edit: the cache has one format (give one edit)"
        )
    return edits


# -- use ---------------------------------------------------------------------------------------


def class_selections(edits: Sequence[Edit]) -> list[str]:
    """The head classes the edits select by (``class:`` and ``random:`` selections), in order."""
    found = [edit.heads.head_class for edit in edits if isinstance(edit, ATTENTION_EDITS) and edit.heads.by_class]
    return list(dict.fromkeys(found))


def with_head_classes(edits: Sequence[Edit], head_classes: Mapping[Head, str]) -> tuple[Edit, ...]:
    """The edits with every ``class:`` selection turned into the list of the heads that
    ``head_classes`` (the untouched run's (layer, head) -> label) gives that label, and
    every ``random:`` selection into its matched draw."""
    resolved = []
    for edit in edits:
        if isinstance(edit, ATTENTION_EDITS) and edit.heads.by_class:
            heads = tuple(sorted(edit.heads.resolve(0, 0, head_classes)))
            edit = dataclasses.replace(edit, heads=HeadSelection("list", heads=heads))
        resolved.append(edit)
    return tuple(resolved)


def atlas_selections(edits: Sequence[Edit]) -> list[str]:
    """The head atlases (sweep names) the edits select by (``atlas:`` selections), in order."""
    found = [edit.heads.atlas for edit in edits if isinstance(edit, ATTENTION_EDITS) and edit.heads.by_atlas]
    return list(dict.fromkeys(found))


def with_head_orders(
    edits: Sequence[Edit], head_orders: Mapping[str, Mapping[str, Sequence[Head]]]
) -> tuple[Edit, ...]:
    """The edits with every ``atlas:`` selection turned into the list of its first k heads in
    ``head_orders`` (sweep -> order -> heads, as ``sinkscope.sweeps.read_head_orders`` gives)."""
    resolved = []
    for edit in edits:
        if isinstance(edit, ATTENTION_EDITS) and edit.heads.by_atlas:
            heads = tuple(sorted(edit.heads.resolve(0, 0, head_orders=head_orders)))
            edit = dataclasses.replace(edit, heads=HeadSelection("list", heads=heads))
        resolved.append(edit)
    return tuple(resolved)


def edited_heads(
    edits: Sequence[Edit],
    num_layers: int,
    num_heads: int,
    head_classes: Mapping[Head, str] | None = None,
    head_orders: Mapping[str, Mapping[str, Sequence[Head]]] | None = None,
) -> frozenset[Head]:
    """The heads whose attention the edits change (``mask_keys`` and ``logit_bias``; a
    cache edit changes what every head reads)."""
    heads: set[Head] = set()
    for edit in edits:
        if isinstance(edit, ATTENTION_EDITS):
            heads |= edit.heads.resolve(num_layers, num_heads, head_classes, head_orders)
    return frozenset(heads)


# -- the untouched run's head classes (written by sinkscope.pipeline.headclasses) ---------------

HEAD_CLASSES_FORMAT = "sinkscope.head_classes/1"


def write_head_classes(path: str | Path, classes: Mapping[Head, str], *, source: str, call: tuple[str, int]) -> None:
    """The classes as JSON, heads in (layer, head) order under their paper labels, with the
    source and the call (pass, step) they were read at."""
    data = {
        "format": HEAD_CLASSES_FORMAT,
        "source": source,
        "call": {"pass": call[0], "step": int(call[1])},
        "classes": {head_label(layer, head): label for (layer, head), label in sorted(classes.items())},
    }
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(data, indent=1) + "\n")


def _read_json(path: Path, missing: str, kind: str, file_format: str, fields: Mapping[str, type]) -> dict:
    """A JSON file's data, an object of ``file_format`` whose ``fields`` have their types; a
    missing file is "no <missing>", an unreadable or other one damaged."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SinkscopeError(f"{path}: no {missing}") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise DamagedFileError(path, f"is not a {kind} file ({error.__class__.__name__})") from None
    if (
        not isinstance(data, dict)
        or data.get("format") != file_format
        or not all(isinstance(data.get(name), kind_of) for name, kind_of in fields.items())
    ):
        raise DamagedFileError(path, f"is not a {kind} file (format {file_format})")
    return data


def _head_of_label(path: Path, label: Any) -> Head:
    """(layer, head) of a paper label ('L1H1') in a file; anything else names it damaged."""
    match = HEAD_LABEL.match(label) if isinstance(label, str) else None
    if not match or min(map(int, match.groups())) < 1:
        raise DamagedFileError(path, f"names {label!r}, not a head like 'L1H1'")
    return parse_head_label(label)


def read_head_classes(path: str | Path) -> dict[Head, str]:
    """(layer, head) -> head class (0-based keys) of a file ``write_head_classes`` wrote."""
    path = Path(path)
    data = _read_json(
        path,
        "head classes (the untouched default run's classes are made first)",
        "head-class",
        HEAD_CLASSES_FORMAT,
        {"classes": dict},
    )
    classes = {}
    for label, head_class in data["classes"].items():
        head = _head_of_label(path, label)
        if not isinstance(head_class, str):
            raise DamagedFileError(path, f"gives {label} the class {head_class!r}, not a label")
        classes[head] = head_class
    return classes


# -- a head atlas's orders (written by sinkscope.pipeline.headorders, read by the pruning runs) ---------

HEAD_ORDERS_FORMAT = "sinkscope.head_orders/1"


def write_head_orders(
    path: str | Path, orders: Mapping[str, Sequence[Head]], *, checkpoint: str, sweep: str, runs: int
) -> None:
    """A head atlas's orders (``HEAD_ORDERS`` -> heads, first to last) as JSON, heads under
    their paper labels, with the checkpoint, the sweep and how many runs ranked them."""
    missing = [order for order in HEAD_ORDERS if order not in orders]
    if missing:
        raise SinkscopeError(f"head orders of {sweep!r} lack {', '.join(missing)}")
    data = {
        "format": HEAD_ORDERS_FORMAT,
        "checkpoint": checkpoint,
        "sweep": sweep,
        "runs": int(runs),
        "orders": {order: [head_label(int(a), int(b)) for a, b in orders[order]] for order in HEAD_ORDERS},
    }
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(data, indent=1) + "\n")


def read_head_orders(path: str | Path) -> dict[str, dict[str, list[Head]]]:
    """sweep -> order -> (layer, head), first to last (0-based), of a file
    ``write_head_orders`` wrote: what ``interventions.with_head_orders`` takes."""
    path = Path(path)
    data = _read_json(
        path,
        "head orders (the atlas's head_atlas table is made first)",
        "head-orders",
        HEAD_ORDERS_FORMAT,
        {"orders": dict, "sweep": str},
    )
    orders: dict[str, list[Head]] = {}
    for order in HEAD_ORDERS:
        labels = data["orders"].get(order)
        if not isinstance(labels, list):
            raise DamagedFileError(path, f"has no {order!r} order")
        heads = [_head_of_label(path, label) for label in labels]
        if len(set(heads)) != len(heads):
            raise DamagedFileError(path, f"names a head twice in its {order!r} order")
        orders[order] = heads
    if len({frozenset(heads) for heads in orders.values()}) > 1:
        raise DamagedFileError(path, "orders different heads in different orders")
    return {data["sweep"]: orders}


def read_selection_files(
    paths: Sequence[str | Path],
) -> tuple[dict[Head, str] | None, dict[str, dict[str, list[Head]]]]:
    """The untouched run's head classes (None without a classes file) and the head orders of
    every atlas among ``paths``, told apart by their format; a file of neither format is
    read as head classes, whose reader names it damaged."""
    classes: dict[Head, str] | None = None
    orders: dict[str, dict[str, list[Head]]] = {}
    for path in map(Path, paths):
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            data = None
        if isinstance(data, dict) and data.get("format") == HEAD_ORDERS_FORMAT:
            orders.update(read_head_orders(path))
        else:
            classes = read_head_classes(path)
    return classes, orders

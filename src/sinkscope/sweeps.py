"""Sweeps (``sweeps:``): one edit template with one axis written ``each``, as many variants.

Standard library only, beside ``sinkscope.interventions``: the config check, the study plan
and the jobs read the same expansion. A sweep is a template of ``generation.interventions``
in which one value is ``each``; it expands into one variant per item, named
``<sweep>/<item>``, whose entry is exactly the ``variants:`` entry a user would write by
hand (``{interventions: [...]}`` in canonical form), so the two forms give equal rule
params and nothing reruns when a study switches between them. Every variant is paired
with the untouched ``default`` run, as any edited variant is.

The axes (``each`` where, ``over`` what, the item names):

- ``heads: each``: one run per head (``L5H10``), over ``all`` (the model's heads), a
  list of heads and layers, a layer (``L5``), ``class:<head class>`` or
  ``random:<head class>`` (known once the untouched run's classes are: ``waiting``);
- ``heads: each:layer``: one run per layer, all its heads (``L5``), over ``all`` or layers;
- ``key_frames: each``: one run per cached frame (``f3``), over ``all`` (every frame
  before the last block: the frames a later block sees), ``sink`` or a list of frames;
- ``heads: each`` with ``over: atlas:<head sweep>``: the pruning curve. For each head
  count k of ``k`` (a grid up to every head of that atlas, ``auto`` by default) and each
  order of ``HEAD_ORDERS`` (least drift first; a seeded random order; least untouched
  frame-0 mass first) one run masks the first k heads (``drift_k9``, ``random_k9``,
  ``frame0_mass_k9``; at k = every head the orders agree: one run, ``all_k72``). Its heads
  are ``atlas:<sweep>:<order>:<k>``, which the extraction job resolves from the atlas's
  head orders (``read_head_orders``, ``interventions.with_head_orders``), as ``class:``
  selections wait for the untouched run's classes.

docs/atlas.md describes the sweeps and the tables made from them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sinkscope.errors import ConfigError
from sinkscope.interventions import (
    ATLAS_PREFIX,
    HEAD_ORDERS,
    HEAD_ORDERS_FORMAT,
    NAME,
    Edit,
    FrameSelection,
    Head,
    HeadSelection,
    parse_heads,
    parse_interventions,
    read_head_orders,
    write_head_orders,
)
from sinkscope.names import VARIANT_NAME_PATTERN
from sinkscope.naming import HEAD_LABEL, head_label, layer_label, parse_head_label

__all__ = [
    "EACH",
    "EACH_LAYER",
    "HEAD_ORDERS",
    "HEAD_ORDERS_FORMAT",
    "SEPARATOR",
    "SWEEP_KEYS",
    "VARIANT_NAME",
    "Sweep",
    "SweepExpansion",
    "SweepItem",
    "expand_sweeps",
    "is_atlas_run",
    "parse_sweeps",
    "pruning_grid",
    "read_head_orders",
    "sweep_item",
    "sweep_message",
    "sweep_problems",
    "write_head_orders",
]

EACH = "each"
EACH_LAYER = "each:layer"
SEPARATOR = "/"
# The keys of one sweep.
SWEEP_KEYS = ("interventions", "over", "k")
# A variant's name: a name, or <sweep>/<item> (a swept variant, or the same written by hand).
VARIANT_NAME = re.compile(VARIANT_NAME_PATTERN)
# What ``each`` runs over: a head, a layer, a cached frame, or a head count of an atlas's order.
HEAD, LAYER, FRAME, RANKED = "head", "layer", "frame", "ranked"
# The fractions of the atlas's heads in the ``k: auto`` grid: finer where few heads are masked.
GRID_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4, 7 / 8, 1)
# The item that masks every head of the atlas (the orders agree there): all_k<count>.
ALL_ORDERS = "all"
_FRAME_ITEM = re.compile(r"^f(\d+)$")
_LAYER_ITEM = re.compile(r"^L(\d+)$")
_RANKED_ITEM = re.compile(r"^(" + "|".join(map(re.escape, (*HEAD_ORDERS, ALL_ORDERS))) + r")_k(\d+)$")


def _problem(where: str, message: str) -> ConfigError:
    return ConfigError(f"config key {where}: {message}")


def _guess(word: Any, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(word), list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def pruning_grid(count: int) -> tuple[int, ...]:
    """``k: auto``: head counts up to every one of ``count`` heads, finer at the start
    (72 heads: 5, 9, 18, 27, 36, 45, 54, 63, 72)."""
    return tuple(sorted({max(1, math.ceil(count * fraction)) for fraction in GRID_FRACTIONS})) if count else ()


# -- one sweep -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """One parsed sweep: its template (``edits``, the swept one at ``index`` holding a
    placeholder), the ``axis`` its ``each`` runs over, and ``over``: a ``HeadSelection``
    (heads, layers), a ``FrameSelection`` (frames) or the atlas sweep's name (ranked);
    ``counts``: the ranked sweep's head counts (None: ``auto``)."""

    name: str
    edits: tuple[Edit, ...]
    index: int
    axis: str
    over: HeadSelection | FrameSelection | str
    counts: tuple[int, ...] | None = None

    @property
    def needs_classes(self) -> bool:
        """Whether its items wait for the untouched run's head classes (``over: class:sink``)."""
        return isinstance(self.over, HeadSelection) and self.over.by_class

    def variant(self, item: str, selection: HeadSelection | FrameSelection) -> tuple[str, dict[str, Any]]:
        """(``<sweep>/<item>``, its ``variants:`` entry): the template with ``selection`` in place of ``each``."""
        edits = list(self.edits)
        key = "key_frames" if self.axis == FRAME else "heads"
        edits[self.index] = dataclasses.replace(edits[self.index], **{key: selection})
        name = f"{self.name}{SEPARATOR}{item}"
        if not VARIANT_NAME.match(name):
            raise _problem(f"sweeps.{self.name}", f"item {item!r} makes {name!r}, not a variant name")
        return name, {"interventions": [edit.to_config() for edit in edits]}


def _find_each(items: Sequence[Any], where: str) -> list[tuple[int, str, str]]:
    """(edit index, key, ``each`` spelling) of every ``each`` in the template; an ``each``
    inside a list, or a misspelt one, is refused."""
    found = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        for key, value in item.items():
            values = value if isinstance(value, (list, tuple)) else [value]
            words = [v.strip() for v in values if isinstance(v, str) and v.strip().lower().startswith(EACH)]
            if not words:
                continue
            if isinstance(value, (list, tuple)):
                raise _problem(f"{where}[{index}].{key}", f"{value!r}: write {words[0]!r} alone, not in a list")
            if key not in ("heads", "key_frames"):
                raise _problem(f"{where}[{index}].{key}", f"{value!r}: each runs over heads or key_frames only")
            allowed = (EACH, EACH_LAYER) if key == "heads" else (EACH,)
            if words[0] not in allowed:
                raise _problem(
                    f"{where}[{index}].{key}",
                    f"{value!r} is not {' or '.join(map(repr, allowed))}{_guess(words[0], allowed)}",
                )
            found.append((index, key, words[0]))
    return found


def parse_sweep(name: str, entry: Any) -> Sweep:
    """One ``sweeps:`` entry, checked; a ``ConfigError`` whose one line names ``sweeps.<name>.<key>``."""
    where = f"sweeps.{name}"
    if not isinstance(name, str) or not NAME.match(name):
        raise _problem(where, f"name {name!r} is not allowed (use letters, digits and _ . + - only)")
    if not isinstance(entry, Mapping):
        raise _problem(
            where, f"{entry!r} is not a sweep like {{interventions: [{{edit: mask_keys, heads: each, ...}}]}}"
        )
    unknown = [key for key in entry if key not in SWEEP_KEYS]
    if unknown:
        raise _problem(
            where,
            f"unknown key {unknown[0]!r}{_guess(unknown[0], SWEEP_KEYS)}; a sweep takes {', '.join(SWEEP_KEYS)} "
            "(its runs are the default variant's generation with the edits: set other keys in generation:)",
        )
    template = entry.get("interventions")
    if isinstance(template, Mapping):
        template = [template]
    if not isinstance(template, (list, tuple)) or not template:
        raise _problem(
            f"{where}.interventions",
            f"{template!r} is not a list of edits with one value written each "
            "(e.g. [{edit: mask_keys, heads: each, key_frames: sink}])",
        )
    found = _find_each(template, f"{where}.interventions")
    if not found:
        raise _problem(
            f"{where}.interventions", "no value is written each: a sweep runs one axis (heads: each, key_frames: each)"
        )
    if len(found) > 1:
        (i, a, _), (j, b, _) = found[:2]
        raise _problem(
            f"{where}.interventions",
            f"each is written twice ([{i}].{a} and [{j}].{b}): a sweep runs one axis; write two sweeps",
        )
    index, key, word = found[0]
    placeholder = {"heads": "all", "key_frames": "cached"}[key]
    filled = [dict(item) if isinstance(item, Mapping) else item for item in template]
    filled[index][key] = placeholder
    edits = parse_interventions(filled, f"{where}.interventions")
    over = entry.get("over", "all")
    if over is None or (isinstance(over, (list, tuple)) and not over):
        raise _problem(
            f"{where}.over",
            f"{over!r} names nothing each could run over; over is all, heads (L5H10, L5, class:sink), frames "
            "(sink, [3, 4]) or atlas:<head sweep>",
        )
    counts = entry.get("k")
    ranked = isinstance(over, str) and over.strip().startswith(ATLAS_PREFIX)
    if counts is not None and counts != "auto" and not ranked:
        raise _problem(f"{where}.k", f"{counts!r}: k (head counts) belongs to a sweep over atlas:<head sweep>")
    if ranked:
        if word != EACH or key != "heads":
            raise _problem(f"{where}.over", f"{over!r} takes heads: each (the k heads of the atlas's orders)")
        atlas = over.strip()[len(ATLAS_PREFIX) :].strip()
        if not NAME.match(atlas):
            raise _problem(f"{where}.over", f"{over!r}: {atlas!r} is not a sweep name (atlas:<head sweep>)")
        return Sweep(name, edits, index, RANKED, atlas, _counts(counts, f"{where}.k"))
    if key == "key_frames":
        return Sweep(name, edits, index, FRAME, _frames_over(over, f"{where}.over"))
    selection = parse_heads(over, f"{where}.over")
    if word == EACH_LAYER:
        if selection.kind not in ("all", "layer"):
            raise _problem(
                f"{where}.over", f"{over!r}: a sweep over layers runs over all, or layers like L5 or [L1, L5]"
            )
        return Sweep(name, edits, index, LAYER, selection)
    if selection.by_atlas:
        raise _problem(f"{where}.over", f"{over!r} is not atlas:<head sweep>")
    return Sweep(name, edits, index, HEAD, selection)


def _counts(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None or (isinstance(value, str) and value.strip() == "auto"):
        return None
    items = value if isinstance(value, (list, tuple)) else [value]
    counts = []
    for item in items:
        number = int(item) if isinstance(item, int) and not isinstance(item, bool) else None
        if isinstance(item, str) and re.fullmatch(r"\s*\d+\s*", item):
            number = int(item)
        if number is None or number < 1:
            raise _problem(where, f"{item!r} is not a head count (1, 2, ...); k is auto or a list of counts")
        counts.append(number)
    if not counts:
        raise _problem(where, "[] names no head count; k is auto or a list of counts")
    return tuple(sorted(set(counts)))


def _frames_over(value: Any, where: str) -> FrameSelection:
    if isinstance(value, str) and value.strip() in ("all", "cached"):
        return FrameSelection("cached")
    if isinstance(value, str) and value.strip() == "sink":
        return FrameSelection("sink")
    items = value if isinstance(value, (list, tuple)) else [value]
    frames = []
    for item in items:
        number = item if isinstance(item, int) and not isinstance(item, bool) else None
        if isinstance(item, str) and re.fullmatch(r"\s*\d+\s*", item):
            number = int(item)
        if number is None or number < 0:
            raise _problem(
                where,
                f"{item!r} is not a latent frame{_guess(item, ('all', 'sink'))}; a frame sweep runs over all, sink "
                "or a list of frames",
            )
        frames.append(number)
    if not frames:
        raise _problem(where, "[] names no frame; a frame sweep runs over all, sink or a list of frames")
    return FrameSelection("list", tuple(sorted(set(frames))))


def parse_sweeps(
    sweeps: Mapping[str, Any] | None, variants: Sequence[str] | Mapping[str, Any] = ()
) -> dict[str, Sweep]:
    """Every sweep of the study (``sweeps:``), checked against each other and the study's
    ``variants`` (names, or the ``variants:`` mapping: ``sweep_problems``); a
    ``ConfigError`` naming every problem."""
    parsed, problems = {}, []
    for name, entry in (sweeps or {}).items():
        try:
            parsed[name] = parse_sweep(name, entry)
        except ConfigError as error:
            problems.append(str(error).removeprefix("invalid config: "))
    problems += sweep_problems(parsed, variants)
    if problems:
        raise ConfigError.invalid(problems)
    return parsed


def sweep_problems(sweeps: Mapping[str, Sweep], variants: Sequence[str] | Mapping[str, Any] = ()) -> list[str]:
    """What the sweeps cannot mean together: a sweep named like a variant or ``default``, a
    hand-written variant ``<sweep>/<item>`` of a sweep (give one form), a ranked sweep whose
    atlas is not a head sweep of the study, or waits for classes while its k is ``auto``;
    and, given the ``variants:`` mapping, a variant's ``atlas:`` selection naming no head
    sweep (its other problems are the variant check's)."""
    problems = []
    if isinstance(variants, Mapping):
        atlases = [name for name, sweep in sweeps.items() if sweep.axis == HEAD] + head_atlases_by_hand(variants)
        for where, selection in atlas_selections(variants):
            if str(selection.atlas) not in atlases:
                problems.append(
                    f"config key {where}: {selection.to_config()!r} names no sweep of heads: each "
                    f"({', '.join(atlases) or 'the study has none'})"
                )
        variants = list(variants)
    for name in sweeps:
        if name == "default" or name in variants:
            problems.append(
                f"config key sweeps.{name}: {name!r} is the name of a variant; a sweep's runs are {name}/<item>, "
                "name the sweep otherwise"
            )
    for variant in variants:
        sweep = variant.split(SEPARATOR, 1)[0] if SEPARATOR in variant else None
        if sweep in sweeps:
            problems.append(
                f"config key variants.{variant}: sweep {sweep!r} makes the variants {sweep}/<item>; write the run "
                "either in the sweep or by hand, not both"
            )
        elif variant != "default" and not VARIANT_NAME.match(variant):
            problems.append(f"config key variants.{variant}: name {variant!r} is not <name> or <sweep>/<item>")
    for name, sweep in sweeps.items():
        if sweep.axis != RANKED:
            continue
        atlas = sweeps.get(str(sweep.over))
        if atlas is None or atlas.axis != HEAD:
            known = [other for other, entry in sweeps.items() if entry.axis == HEAD]
            what = "no sweep" if atlas is None else f"a sweep over {atlas.axis}s"
            problems.append(
                f"config key sweeps.{name}.over: atlas:{sweep.over} names {what}; it names a sweep of heads: each"
                + (f" ({', '.join(known)})" if known else " (the study has none)")
            )
        elif atlas.needs_classes and sweep.counts is None:
            problems.append(
                f"config key sweeps.{name}.k: auto needs the atlas's head count, which {sweep.over!r} knows only "
                f"once the untouched run's classes are made ({atlas.over.to_config()}); list the counts"
            )
    return problems


def atlas_selections(variants: Mapping[str, Any]) -> list[tuple[str, HeadSelection]]:
    """(config key, selection) of every ``atlas:`` head selection of the hand-written
    ``variants`` (a variant whose edits do not parse is left to the variant check)."""
    found = []
    for variant, entry in variants.items():
        where = f"variants.{variant}.interventions"
        try:
            edits = parse_interventions((entry or {}).get("interventions"), where)
        except ConfigError:
            continue
        for index, edit in enumerate(edits):
            selection = getattr(edit, "heads", None)
            if selection is not None and selection.by_atlas:
                found.append((f"{where}[{index}].heads", selection))
    return found


def atlas_count_problems(variants: Mapping[str, Any], heads: Mapping[str, int]) -> list[str]:
    """A hand-written variant's ``atlas:<sweep>:<order>:<k>`` that takes more heads than its
    head sweep runs over (``heads``: sweep -> its runs, ``SweepExpansion.counts``)."""
    return [
        f"config key {where}: {selection.to_config()!r} takes {selection.count} heads; atlas "
        f"{selection.atlas!r} runs over {heads[str(selection.atlas)]} heads"
        for where, selection in atlas_selections(variants)
        if str(selection.atlas) in heads and selection.count > heads[str(selection.atlas)]
    ]


def head_atlases_by_hand(variants: Sequence[str] | Mapping[str, Any]) -> list[str]:
    """The head atlases written by hand: each ``<name>`` of variants named ``<name>/<head>``
    (``heads/L5H10``), which ``atlas:<name>:...`` selections of variants may rank."""
    found = [sweep_item(variant) for variant in variants]
    return list(dict.fromkeys(item.sweep for item in found if item is not None and item.axis == HEAD))


def sweep_message(message: str, sweeps: Sequence[str]) -> str:
    """A check's message about a swept variant (``config key variants.<sweep>/<item>.<key>``)
    said of the sweep, where the user wrote it: ``config key sweeps.<sweep>.<key>``, the run
    named at the end. Messages about other variants pass unchanged."""
    found = re.search(r"config key variants\.([^/\s.]+(?:\.[^/\s.]+)*)/([^\s.]+)\.", message)
    if found is None or found.group(1) not in sweeps:
        return message
    sweep, item = found.group(1), found.group(2)
    text = message[: found.start()] + f"config key sweeps.{sweep}." + message[found.end() :]
    return f"{text} (run {sweep}{SEPARATOR}{item})"


# -- expansion -----------------------------------------------------------------------------------


@dataclass
class SweepExpansion:
    """The swept variants of one checkpoint: ``variants`` (name -> ``variants:`` entry, in
    sweep order), ``waiting`` (sweeps whose items come from the untouched run's classes,
    not given yet) and ``counts`` (sweep -> its runs per prompt and seed; for a waiting
    sweep the most it can have)."""

    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def expand_sweeps(
    sweeps: Mapping[str, Sweep],
    *,
    num_layers: int,
    num_heads: int,
    block_sizes: Sequence[int],
    sink_frames: int = 0,
    head_classes: Mapping[Head, str] | None = None,
) -> SweepExpansion:
    """The variants of every sweep for one checkpoint: its model's ``num_layers`` x
    ``num_heads`` and its untouched run's ``block_sizes`` and ``sink_frames`` (the policy's,
    0 without a sink: frame 0 is the sink then). A sweep over ``class:`` (or ``random:``)
    heads expands once ``head_classes`` (the untouched run's, ``read_head_classes``) are
    given; until then it is ``waiting``, and so is a ranked sweep over it. Raises
    ``ConfigError`` for an ``over`` the model or the video lacks."""
    problems = sweep_problems(sweeps)
    if problems:
        raise ConfigError.invalid(problems)
    result = SweepExpansion()
    heads_of: dict[str, list[Head] | None] = {}
    for name, sweep in sweeps.items():
        if sweep.axis == RANKED:
            continue
        if sweep.needs_classes and head_classes is None:
            result.waiting.append(name)
            heads_of[name] = None
            result.counts[name] = num_layers * num_heads  # at most every head of the model
            continue
        items = _items(sweep, num_layers, num_heads, block_sizes, sink_frames, head_classes)
        for item, selection in items:
            variant, entry = sweep.variant(item, selection)
            result.variants[variant] = entry
        result.counts[name] = len(items)
        heads_of[name] = [selection.heads[0] for _, selection in items] if sweep.axis == HEAD else None
    for name, sweep in sweeps.items():
        if sweep.axis != RANKED:
            continue
        atlas = sweeps[str(sweep.over)]
        known = heads_of.get(str(sweep.over))
        if known is None and str(sweep.over) in result.waiting:
            result.waiting.append(name)
            counts = sweep.counts or ()
            result.counts[name] = len(counts) * len(HEAD_ORDERS)
            continue
        counts = sweep.counts if sweep.counts is not None else pruning_grid(len(known or []))
        if known is not None and counts and counts[-1] > len(known):
            raise _problem(
                f"sweeps.{name}.k",
                f"{counts[-1]} heads: atlas {sweep.over!r} runs over {len(known)} heads ({atlas.over.to_config()})",
            )
        for item, selection in _ranked_items(sweep, atlas, counts, len(known) if known is not None else None):
            variant, entry = sweep.variant(item, selection)
            result.variants[variant] = entry
            result.counts[name] = result.counts.get(name, 0) + 1
    return result


def _items(
    sweep: Sweep,
    num_layers: int,
    num_heads: int,
    block_sizes: Sequence[int],
    sink_frames: int,
    head_classes: Mapping[Head, str] | None,
) -> list[tuple[str, HeadSelection | FrameSelection]]:
    """(item name, the selection in place of ``each``) of a head, layer or frame sweep."""
    where = f"sweeps.{sweep.name}.over"
    if sweep.axis == FRAME:
        starts = [sum(block_sizes[:i]) for i in range(len(block_sizes))]
        last_start, total = starts[-1], sum(block_sizes)
        cached = list(range(last_start))
        sink = list(range(sink_frames)) if sink_frames > 0 else [0]
        assert isinstance(sweep.over, FrameSelection)
        for frame in sweep.over.frames:
            if frame >= total:
                raise _problem(where, f"frame {frame} is past the video's last frame {total - 1}")
            if frame >= last_start:
                raise _problem(
                    where,
                    f"frame {frame} is in the last block (frames {last_start}-{total - 1}), which no later block "
                    "sees: edits touch cached frames only",
                )
        frames = sweep.over.resolve(cached, sink)
        if not frames:
            raise _problem(where, f"{sweep.over.to_config()!r} holds no frame before the last block")
        return [(f"f{frame}", FrameSelection("list", (frame,))) for frame in frames]
    assert isinstance(sweep.over, HeadSelection)
    missing = sweep.over.problems(num_layers, num_heads)
    if missing:
        what = "a head" if "H" in missing[0] else "a layer"
        raise _problem(where, f"{missing[0]} is not {what} of the model ({num_layers} layers, {num_heads} heads)")
    if sweep.axis == LAYER:
        layers = range(num_layers) if sweep.over.kind == "all" else sweep.over.layers
        return [(layer_label(layer), HeadSelection("layer", layers=(layer,))) for layer in sorted(layers)]
    heads = sorted(sweep.over.resolve(num_layers, num_heads, head_classes))
    if not heads and not sweep.needs_classes:
        raise _problem(where, f"{sweep.over.to_config()!r} holds no head")
    return [(head_label(*head), HeadSelection("list", heads=(head,))) for head in heads]


def _ranked_items(
    sweep: Sweep, atlas: Sweep, counts: Sequence[int], total: int | None
) -> list[tuple[str, HeadSelection]]:
    """Per head count and order, the first k heads of the atlas; at k = every head of the
    atlas one run, whose heads are the atlas's own selection where the plan knows it."""
    items = []
    for count in counts:
        if total is not None and count == total:
            every = atlas.over
            assert isinstance(every, HeadSelection)
            selection = (
                every
                if not every.by_class
                else HeadSelection("atlas", atlas=atlas.name, order=HEAD_ORDERS[0], count=count)
            )
            items.append((f"{ALL_ORDERS}_k{count}", selection))
            continue
        for order in HEAD_ORDERS:
            items.append((f"{order}_k{count}", HeadSelection("atlas", atlas=atlas.name, order=order, count=count)))
    return items


# -- what a swept variant's name says ----------------------------------------------------------------


@dataclass(frozen=True)
class SweepItem:
    """What a ``<sweep>/<item>`` name says: its sweep, item and axis, and the head
    (``layer``, ``head``), layer (``head`` -1: every head), frame, or the ranked run's
    ``order`` (``all``: every head of the atlas) and head ``count``."""

    sweep: str
    item: str
    axis: str
    layer: int = -1
    head: int = -1
    frame: int = -1
    order: str | None = None
    count: int = 0


def is_atlas_run(variant: str) -> bool:
    """Whether a variant is an atlas run: named ``<sweep>/<item>`` (a sweep's run, or the
    same written by hand), which the workflow extracts and pairs with the untouched run
    but gives no tables or figures of its own (docs/atlas.md)."""
    return SEPARATOR in str(variant)


def sweep_item(variant: str) -> SweepItem | None:
    """The item of a swept variant's name (``sink_per_head/L5H10``), None for another name."""
    if SEPARATOR not in str(variant):
        return None
    sweep, item = str(variant).split(SEPARATOR, 1)
    if HEAD_LABEL.match(item) and min(map(int, HEAD_LABEL.match(item).groups())) >= 1:
        layer, head = parse_head_label(item)
        return SweepItem(sweep, item, HEAD, layer=layer, head=head)
    if (match := _LAYER_ITEM.match(item)) and int(match.group(1)) >= 1:
        return SweepItem(sweep, item, LAYER, layer=int(match.group(1)) - 1)
    if match := _FRAME_ITEM.match(item):
        return SweepItem(sweep, item, FRAME, frame=int(match.group(1)))
    if (match := _RANKED_ITEM.match(item)) and int(match.group(2)) >= 1:
        return SweepItem(sweep, item, RANKED, order=match.group(1), count=int(match.group(2)))
    return None

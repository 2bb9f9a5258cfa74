"""Does a finished run's cache hold what its policy declares? (``sinkscope check --results``)

The declared layout of every call comes from the real code: the run's generation options
(the procedure, the cache policy and its frame counts, the prompt switches) drive a
stand-in model of one layer, one head and one token a frame through
``generation.sampler.generate``, and each call's ``policy.layout(0)`` is read as the
capture reads it (one table call per block of a Rolling Forcing window call; shifts
relative to the queries'). So the check follows every registered procedure and policy,
with nothing written for any of them. Cache edits (``interventions``) change what the
cache holds, not where: the stand-in runs without them.

A captured call contradicts the declaration when its query frames differ, when it lacks a
key frame (at a RoPE shift) the policy holds, holds one it does not, or holds part of a
frame the policy keeps whole. Which tokens a score-selecting policy keeps
(participative compression) depends on the video: the frames it chooses among
(``CachePolicy.chosen_frames``) may hold any number of their tokens, or none, and only
the call's total of key tokens is checked against the declared one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.generation.common import CallInfo
from sinkscope.generation.sampler import generate
from sinkscope.model import WanConfig, build_model
from sinkscope.model.layout import AttentionLayout
from sinkscope.naming import layer_file
from sinkscope.options import GenerationOptions
from sinkscope.tables import read_metadata, read_table

# The stand-in: one layer, one head of the smallest width RoPE takes, a 2x2 latent grid
# under 2x2 patches (one token a frame).
STAND_IN = WanConfig(
    dim=8,
    ffn_dim=8,
    num_heads=1,
    num_layers=1,
    in_dim=4,
    out_dim=4,
    text_dim=8,
    text_len=2,
    freq_dim=8,
    latent_height=2,
    latent_width=2,
)
# The columns a check reads from a layer's frame rows.
LAYOUT_COLUMNS = ["block", "pass", "step", "query_frame", "key_frame", "key_tokens", "key_position_shift"]

CallKey = tuple[int, str, int]  # (block, pass, step)


@dataclass(frozen=True)
class DeclaredCall:
    """One table call as the policy lays it out: its query frames, each key segment's
    (frame, RoPE shift relative to the queries'), and the frames whose tokens the scores
    choose (any number of them may stay)."""

    block: int
    pass_: str
    step: int
    query_frames: tuple[int, ...]
    segments: tuple[tuple[int, int], ...]
    chosen: frozenset[int] = frozenset()

    @property
    def key(self) -> CallKey:
        return (self.block, self.pass_, self.step)


class _LayoutRecorder:
    """Observer of the stand-in's calls (``begin_call``) and of its one layer's attention."""

    def __init__(self) -> None:
        self.call: CallInfo | None = None
        self.policy: Any = None
        self.calls: list[DeclaredCall] = []

    def begin_call(self, info: CallInfo) -> None:
        self.call = info

    def note_policy(self, _module: Any, _args: Any, kwargs: Mapping[str, Any]) -> None:
        self.policy = kwargs.get("cache_policy", self.policy)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, **_: Any) -> None:
        chosen = frozenset(self.policy.chosen_frames(0)) if self.policy is not None else frozenset()
        segments = tuple(zip(layout.key_frames, layout.relative_position_shift))
        for part in self.call.table_calls:
            own = range(part.start_frame, part.start_frame + part.num_frames)
            frames = layout.query_frames if part is self.call else own
            self.calls.append(DeclaredCall(part.block, part.pass_, part.step, tuple(frames), segments, chosen))
        return None


def declared_calls(options: GenerationOptions, switch_frames: Sequence[int] = ()) -> list[DeclaredCall]:
    """Every table call of a generation under ``options`` (prompt switches at
    ``switch_frames``), laid out by the real procedure and policy on the stand-in, in the
    order the procedure announces them."""
    if getattr(options, "interventions", ()):
        options = dataclasses.replace(options, interventions=())
    options = dataclasses.replace(options, latent_height=STAND_IN.latent_height, latent_width=STAND_IN.latent_width)
    model = build_model(STAND_IN, seed=0)
    context = torch.zeros(1, 1, STAND_IN.text_dim)
    schedule = [(0, context)] + [(int(frame), context) for frame in switch_frames]
    recorder = _LayoutRecorder()
    hook = model.register_forward_pre_hook(recorder.note_policy, with_kwargs=True)
    model.set_observer(0, recorder)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tensors of a few values: threads only cost (20x at 240 frames)
    try:
        generate(model, schedule if switch_frames else context, options=options, seed=0, observers=[recorder])
    finally:
        torch.set_num_threads(threads)
        hook.remove()
        model.set_observer(0, None)
    return recorder.calls


def _captured_calls(rows: pd.DataFrame) -> dict[tuple[int, CallKey], tuple[set[int], dict[tuple[int, int], int]]]:
    """(layer, call) -> (query frames, {(key frame, shift): key tokens}) of frame rows."""
    if "head" in rows:
        rows = rows[rows["head"] == rows["head"].min()]
    found: dict[tuple[int, CallKey], tuple[set[int], dict[tuple[int, int], int]]] = {}
    columns = ["layer", *LAYOUT_COLUMNS]
    for layer, block, pass_, step, query, frame, tokens, shift in (
        rows[columns].drop_duplicates().itertuples(index=False)
    ):
        queries, keys = found.setdefault((int(layer), (int(block), str(pass_), int(step))), (set(), {}))
        queries.add(int(query))
        keys[(int(frame), int(shift))] = max(int(tokens), keys.get((int(frame), int(shift)), 0))
    return found


def _shifts(shifts: set[int]) -> str:
    return ", ".join(f"{shift:+d}" for shift in sorted(shifts))


def call_problems(
    declared: DeclaredCall, queries: set[int], keys: Mapping[tuple[int, int], int], frame_seq_length: int
) -> list[str]:
    """How one captured call's cache contents contradict its declared layout (empty: they agree)."""
    problems = []
    if queries != set(declared.query_frames):
        problems.append(f"query frames {sorted(queries)}, the procedure's are {list(declared.query_frames)}")
    wanted: dict[int, set[int]] = {}
    for frame, shift in declared.segments:
        wanted.setdefault(frame, set()).add(shift)
    held: dict[int, set[int]] = {}
    for frame, shift in keys:
        held.setdefault(frame, set()).add(shift)
    for frame in sorted(set(wanted) | set(held)):
        want, have = wanted.get(frame, set()), held.get(frame, set())
        if frame in declared.chosen and (not want or not have):
            continue  # chosen by the scores: kept in part, or not at all
        if want != have:
            if not have:
                problems.append(f"frame {frame} is missing (the policy holds it at RoPE shift {_shifts(want)})")
            elif not want:
                problems.append(f"frame {frame} is held at RoPE shift {_shifts(have)} (the policy does not hold it)")
            else:
                problems.append(f"frame {frame} is held at RoPE shift {_shifts(have)}, the policy's is {_shifts(want)}")
            continue
        for shift in sorted(have):
            tokens = keys[(frame, shift)]
            if tokens > frame_seq_length or (frame not in declared.chosen and tokens != frame_seq_length):
                problems.append(
                    f"frame {frame} holds {tokens} of its {frame_seq_length} tokens"
                    + ("" if frame in declared.chosen else " (the policy keeps it whole)")
                )
    if declared.chosen and not problems:
        total, expected = sum(keys.values()), len(declared.segments) * frame_seq_length
        if total != expected:
            problems.append(f"{total} key tokens, the policy keeps {expected}")
    return problems


@lru_cache(maxsize=16)
def _declared(options_json: str, switch_frames: tuple[int, ...]) -> tuple[DeclaredCall, ...]:
    """``declared_calls``, once for all the layers and runs of equal options."""
    return tuple(declared_calls(GenerationOptions.from_config(json.loads(options_json)), switch_frames))


def check_rows(
    rows: pd.DataFrame,
    options: GenerationOptions,
    *,
    frame_seq_length: int,
    switch_frames: Sequence[int] = (),
    where: str = "",
) -> list[str]:
    """One line per captured call (of every layer in ``rows``: frame_attention rows of
    one run) whose cache contents contradict the layout ``options`` declare, or whose
    call the procedure does not make; a call the rows lack is no contradiction (the rows
    of an interrupted run are the integrity check's business)."""
    prefix = f"{where}: " if where else ""
    try:
        calls = _declared(json.dumps(options.to_dict(), sort_keys=True), tuple(int(f) for f in switch_frames))
    except (ValueError, RuntimeError, TypeError) as error:  # one line for the user; the cause in the log
        raise SinkscopeError(
            f"{prefix}cannot replay cache_policy {options.cache_policy!r} under procedure "
            f"{options.procedure!r} on the stand-in model: {str(error).splitlines()[0]}"
        ) from error
    declared: dict[CallKey, DeclaredCall] = {}
    for call in calls:
        declared.setdefault(call.key, call)
    order = {key: index for index, key in enumerate(declared)}  # the procedure's call order
    lines = []
    captured = _captured_calls(rows)
    for layer, key in sorted(captured, key=lambda found: (found[0], order.get(found[1], len(order)), found[1])):
        queries, keys = captured[(layer, key)]
        block, pass_, step = key
        label = f"{prefix}layer {layer} block {block} {pass_} step {step}"
        if key not in declared:
            lines.append(f"{label}: a call the procedure does not make")
            continue
        problems = call_problems(declared[key], queries, keys, frame_seq_length)
        if problems:
            lines.append(f"{label}: " + "; ".join(problems))
    return lines


def _switch_frames(meta: Mapping[str, Any]) -> list[int]:
    if meta.get("prompt_switches"):
        return [int(f) for f in meta["prompt_switches"]]
    prompt = meta.get("prompt")
    if isinstance(prompt, list):
        return [int(segment["start_frame"]) for segment in prompt[1:]]
    return []


def check_extraction(folder: str | Path) -> list[str]:
    """``check_rows`` of one extraction folder: its layer files, the generation options and
    prompt switches its files record."""
    from sinkscope.manifests import read_manifest

    folder = Path(folder)
    manifest = read_manifest(folder)
    lines = []
    for layer in manifest["contents"]["layers"]:
        path = layer_file(folder, layer)
        meta = read_metadata(path)
        if "generation" not in meta or "frame_seq_length" not in meta:
            raise SinkscopeError(
                f"{path}: no generation options recorded (an older sinkscope wrote it); extract it again"
            )
        # Every head of a call sees one layout: one head's rows are enough.
        rows = read_table(path, columns=["layer", "head", *LAYOUT_COLUMNS], filters=[("head", "=", 0)])
        options = GenerationOptions.from_config(meta["generation"])
        lines += check_rows(
            rows,
            options,
            frame_seq_length=int(meta["frame_seq_length"]),
            switch_frames=_switch_frames(meta),
            where=str(folder),
        )
    return lines


def check_study_results(folders: Sequence[str | Path]) -> tuple[int, list[str]]:
    """``check_extraction`` of the finished folders among ``folders`` (those with a
    manifest): how many were checked, and the contradicting calls."""
    from sinkscope.manifests import MANIFEST

    finished = [Path(folder) for folder in folders if (Path(folder) / MANIFEST).is_file()]
    return len(finished), [line for folder in finished for line in check_extraction(folder)]

"""Prompt schedules: a ``prompts:`` entry as its segments (LongLive's interactive prompts),
the frames where the prompt switches, and what is wrong with a schedule under given
generation options. Torch-free: the config check and the study plan use it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sinkscope.options import GenerationOptions


@dataclass(frozen=True)
class PromptSegment:
    """One prompt of a schedule: its text, active from latent frame ``start_frame`` on."""

    text: str
    start_frame: int = 0


def prompt_segments(entry: str | Sequence[Mapping[str, Any]] | Sequence[PromptSegment]) -> tuple[PromptSegment, ...]:
    """A ``prompts:`` entry as its segments: a string is one segment from frame 0; a list
    gives ``{text, start_frame}`` per segment (LongLive's interactive prompts)."""
    if isinstance(entry, str):
        return (PromptSegment(entry, 0),)
    segments = []
    for item in entry:
        if isinstance(item, PromptSegment):
            segments.append(item)
        else:
            segments.append(PromptSegment(str(item["text"]), int(item["start_frame"])))
    return tuple(segments)


def switch_frames(segments: Sequence[PromptSegment]) -> list[int]:
    """The frames where the prompt switches (every segment's start but the first)."""
    return [segment.start_frame for segment in segments[1:]]


def schedule_problems(segments: Sequence[PromptSegment], options: GenerationOptions) -> list[tuple[int, str]]:
    """What is wrong with a schedule under ``options``: (segment index, problem) pairs.

    The first segment starts at frame 0; starts increase, lie within the video and at the
    start of a block (a switch takes effect between blocks)."""
    problems: list[tuple[int, str]] = []
    starts = options.block_starts()
    for index, segment in enumerate(segments):
        start = segment.start_frame
        if index == 0:
            if start != 0:
                problems.append((index, f"{start} is not 0: the first segment starts the video"))
            continue
        previous = segments[index - 1].start_frame
        if start <= previous:
            problems.append((index, f"{start} does not come after the previous segment's start {previous}"))
        elif start >= options.num_frames:
            problems.append((index, f"{start} is past the video's last frame {options.num_frames - 1}"))
        elif start not in starts:
            shown = ", ".join(map(str, starts[:6])) + (", ..." if len(starts) > 6 else "")
            problems.append((index, f"{start} is not where a block starts (blocks start at frames {shown})"))
    return problems

"""How a video is generated: the ``generation:`` options, resolved and checked (no torch).

Kept free of torch so that the Snakefile can validate a config, and turn it into rule
params, without importing it. Prompt schedules (``prompts:`` entries that switch at block
starts) are read and checked in ``sinkscope.prompt_schedules``; ``re_cache`` and whether
the policy takes re-cache calls say whether a switch recomputes the cache (LongLive's KV
re-cache). ``GenerationOptions.from_config`` resolves a KV-cache policy's defaults, so that
equivalent configs (``local_attn_frames: 21`` or ``cache_policy: window``) give the same
canonical options and rerun nothing.

KV-cache policies (``cache_policy``) and generation procedures (``procedure``) are one
entry each: ``CACHE_POLICY_TABLE`` holds a ``PolicySpec`` per policy (what it follows,
its published defaults, the window keys it reads, the kinds of calls it takes, its cache
size, the keys of its own), ``PROCEDURE_TABLE`` a ``ProcedureSpec`` per procedure (the
kinds of calls it makes, what it refuses, how many calls it makes, the keys of its own).
A procedure runs every policy that takes the kinds of calls it makes (and makes those the
policy needs): ``CallKind``. A key that only one policy or procedure reads is declared
by it (``OptionSpec``): checked there, refused under the others, handed to its code as it
is (``GenerationOptions.option``, ``policy_options``). The code is registered under the
same names: a policy class with ``register_policy`` (``sinkscope.model.policies``), a
procedure with ``register_procedure`` (``sinkscope.generation``), each in a module of its
own that its package finds; tests check that every spec has exactly one of them. The
config schema takes the names, and the keys they declare, from these tables
(``sinkscope.schema``).
docs/cache-policies.md describes each policy and procedure; docs/architecture.md says
how to add one.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sinkscope.errors import ConfigError
from sinkscope.interventions import CACHE_EDITS, Edit, FrameSelection, ReplaceFrames, parse_interventions

GLOBAL, WINDOW, SINK, DEEP_SINK, PARTICIPATIVE, REROPE_SINK = (
    "global",
    "window",
    "sink",
    "deep_sink",
    "participative_compression",
    "rerope_sink",
)
ROLLING_SINK, RELATIVE_ROPE, EMA_SINK = "rolling_sink", "relative_rope", "ema_sink"
ROLLING_FORCING = "rolling_forcing"
# Krea Realtime 14B's cache, rebuilt every block from a few context frames (policy and procedure).
KREA_RECOMPUTE = "krea_recompute"
# LongLive 2.0's chunk procedure and its cache (window, global sink, scene-cut sink), one name for both.
LONGLIVE2 = "longlive2"
# Generation procedures (``generation.procedure``): Self-Forcing's block loop, Rolling Forcing's window.
SELF_FORCING_PROCEDURE, ROLLING_FORCING_PROCEDURE = "self_forcing", "rolling_forcing"
# krea_recompute's context frames: the oldest one re-encoded from a decoded pixel frame
# through the VAE (Krea's code), or the kept latent (no VAE: tests, the demo).
RECOMPUTE_CONTEXTS = ("reencode", "latent")
# The window keys: every policy has them (``PolicySpec.defaults``) and reads some (``keys``).
POLICY_KEYS = ("local_attn_frames", "sink_frames", "budget_frames", "recent_frames")


class CallKind:
    """The kinds of model calls a procedure makes and a policy takes (each announced to the
    policy in its own way, ``sinkscope.model.policies``)."""

    # Self-Forcing's: a block's calls (its denoising steps, its cache pass) at one start
    # frame, the first of a new block being the one that makes room.
    BLOCK = "block"
    # LongLive's re-cache at a prompt switch (``begin_recache``): the kept frames recomputed
    # in place; only made where a prompt switches with ``re_cache`` (``check_recache``).
    RECACHE = "re-cache"
    # Krea's recompute (``begin_recompute``): the cache cleared and rebuilt from context frames.
    RECOMPUTE = "recompute"
    # LongLive 2.0's scene cuts (``begin_shot``, ``pin_block``): a new shot's positions and sink.
    SHOT = "shot"
    # Rolling Forcing's (``begin_window``, ``begin_cache_update``): a window of blocks at
    # staggered noise levels in one call, then its first block's cache update.
    WINDOW = "rolling window"


@dataclass(frozen=True)
class OptionSpec:
    """A ``generation:`` key that one policy or procedure declares and reads (its own option).

    ``default`` is its value when not set (and its type: a bool takes bools only);
    ``choices`` the values it takes, when they are few; ``omit_default``: whether the
    canonical options (``to_dict``, the rule params) leave it out at its default;
    ``description``: what it does, in the config schema's words. Under another policy or
    procedure a value other than the default is refused. ``sinkscope.schema`` adds it to
    the schema's ``generation:`` from this declaration.
    """

    key: str
    default: Any
    choices: tuple[Any, ...] = ()
    omit_default: bool = True
    description: str = ""

    def check(self, value: Any) -> Any:
        """``value`` as the option holds it; a wrong type or value is one line naming the key."""
        if isinstance(self.default, bool) and not isinstance(value, bool):
            raise OptionsError(f"config key generation.{self.key}: {value!r} is not true or false")
        if self.choices and value not in self.choices:
            raise OptionsError(
                f"config key generation.{self.key}: {value!r} is not one of {', '.join(map(str, self.choices))}"
            )
        return value


@dataclass(frozen=True)
class PolicySpec:
    """One KV-cache policy, as every planning step sees it (no torch).

    The options read its defaults, keys and checks, ``sinkscope.model.policies`` its cache
    size, the memory estimate too: one table, so the three cannot disagree. A policy whose
    window keys need checks the fields cannot express subclasses it and extends ``check``.
    """

    name: str
    # The published defaults of its reference code (docs/cache-policies.md); -1: every frame.
    defaults: Mapping[str, int]
    # The window keys it reads; any other window key set to a non-default value is refused.
    keys: tuple[str, ...]
    # What it follows, in a few words (the reference and its behaviour).
    follows: str = ""
    # The kinds of calls it takes (``CallKind``), and those of them a procedure must make.
    calls: frozenset[str] = frozenset({CallKind.BLOCK})
    needs_calls: frozenset[str] = frozenset()
    # The keys of its own (``OptionSpec``), handed to its class as keywords.
    options: tuple[OptionSpec, ...] = ()
    # Whether the cache holds a window (False: every frame stays, the cache grows with the video).
    bounded: bool = True
    # Whether it needs at least one sink frame.
    needs_sink: bool = False
    # Participative compression holds the new block beside a full window while it compresses.
    holds_block_beyond_window: bool = False
    # Rolling Sink keeps the un-roped keys and the values of the first W - S frames beside the cache.
    keeps_first_window: bool = False
    # Rolling Forcing: the cache holds the anchor beside the attention span (21 + 3 = 24 frames).
    holds_anchor_beyond_window: bool = False
    # It rebuilds stored keys from an un-roped copy of its own (the re-roped anchor, Rolling
    # Sink's re-inserted first window), which the cache edits do not reach.
    rebuilds_keys: bool = False

    @property
    def recaches(self) -> bool:
        """Whether LongLive's re-cache at a prompt switch applies: the cache holds whole frames,
        each at its own RoPE position, so the kept frames can be recomputed in place."""
        return CallKind.RECACHE in self.calls

    def capacity_frames(
        self, *, num_frames: int, local_attn_frames: int, largest_block: int, sink_frames: int = 0
    ) -> int:
        """Frames' worth of key slots its cache allocates."""
        if local_attn_frames == -1:
            return num_frames
        extra = (largest_block if self.holds_block_beyond_window else 0) + (
            sink_frames if self.holds_anchor_beyond_window else 0
        )
        return local_attn_frames + extra

    def kv_frames(self, *, num_frames: int, local_attn_frames: int, sink_frames: int, largest_block: int) -> int:
        """Frames' worth of keys and values it keeps in all: the cache plus its copies."""
        capacity = self.capacity_frames(
            num_frames=num_frames,
            local_attn_frames=local_attn_frames,
            largest_block=largest_block,
            sink_frames=sink_frames,
        )
        return capacity + (max(0, local_attn_frames - sink_frames) if self.keeps_first_window else 0)

    def check(self, options: GenerationOptions) -> None:
        """Refuse window keys the policy cannot run with (one line naming the key)."""
        window, sink = options.local_attn_frames, options.sink_frames
        if not self.bounded:
            if sink:
                raise OptionsError(
                    f"config key generation.sink_frames: {sink} needs a window (generation.local_attn_frames) "
                    "or a cache_policy with a sink"
                )
            if window != -1:
                raise OptionsError(
                    f"config key generation.local_attn_frames: cache_policy {self.name!r} keeps every frame"
                )
            return
        if window < 1:
            raise OptionsError(
                f"config key generation.local_attn_frames: {window} must be positive for cache_policy {self.name!r}"
            )
        if sink and "sink_frames" not in self.keys:
            raise OptionsError(
                f"config key generation.sink_frames: {sink} needs cache_policy 'sink' (or another sink policy), not "
                f"{self.name!r}"
            )
        if self.needs_sink and sink < 1:
            raise OptionsError(
                f"config key generation.sink_frames: {sink} must be at least 1 for cache_policy {self.name!r}"
            )
        self.check_window(options)

    def check_window(self, options: GenerationOptions) -> None:
        """The window holds the sink and the largest block (a policy that needs less overrides this)."""
        window, sink, largest = options.local_attn_frames, options.sink_frames, max(options.block_sizes())
        if window < sink + largest:
            raise OptionsError(
                f"config key generation.local_attn_frames: a window of {window} frames cannot hold "
                f"sink_frames = {sink} plus a block of {largest} frames"
            )


@dataclass(frozen=True)
class ParticipativeCompressionSpec(PolicySpec):
    """Participative compression: the compression budget within the window, holding the sink
    and the recent frames, which hold the current block."""

    def check(self, options: GenerationOptions) -> None:
        super().check(options)
        sink, window, largest = options.sink_frames, options.local_attn_frames, max(options.block_sizes())
        budget, recent = options.budget_frames, options.recent_frames
        if recent < largest:
            raise OptionsError(
                f"config key generation.recent_frames: {recent} must hold the current block ({largest} frames)"
            )
        if budget < sink + recent:
            raise OptionsError(
                f"config key generation.budget_frames: {budget} is below sink_frames + recent_frames = {sink + recent}"
            )
        if budget > window:
            raise OptionsError(
                f"config key generation.budget_frames: {budget} exceeds the window local_attn_frames = {window}"
            )


def _kinds(kinds: frozenset[str]) -> str:
    return ", ".join(sorted(kinds))


def _defaults(window: int = -1, sink: int = 0, budget: int = 0, recent: int = 0) -> dict[str, int]:
    return dict(zip(POLICY_KEYS, (window, sink, budget, recent), strict=True))


_WINDOW_AND_SINK = ("local_attn_frames", "sink_frames")
_RECACHES = frozenset({CallKind.BLOCK, CallKind.RECACHE})
# One row a policy; its class is registered under the same name (``sinkscope.model.policies``).
CACHE_POLICY_TABLE: dict[str, PolicySpec] = {
    spec.name: spec
    for spec in (
        PolicySpec(GLOBAL, _defaults(), (), "Self-Forcing: every frame stays", calls=_RECACHES, bounded=False),
        PolicySpec(
            WINDOW,
            _defaults(21),
            ("local_attn_frames",),
            "Self-Forcing local_attn_size: FIFO eviction",
            calls=_RECACHES,
        ),
        PolicySpec(
            SINK,
            _defaults(12, 3),
            _WINDOW_AND_SINK,
            "Self-Forcing sink_size / LongLive frame sink",
            calls=_RECACHES,
            needs_sink=True,
        ),
        PolicySpec(
            DEEP_SINK,
            _defaults(21, 10),
            _WINDOW_AND_SINK,
            "Deep Forcing, Deep Sink (code: causal_model_DS.py)",
            needs_sink=True,
        ),
        ParticipativeCompressionSpec(
            PARTICIPATIVE,
            _defaults(21, 10, 16, 4),
            POLICY_KEYS,
            "Deep Forcing, Deep Sink + Participative Compression",
            needs_sink=True,
            holds_block_beyond_window=True,
        ),
        PolicySpec(
            REROPE_SINK,
            _defaults(21, 3),
            _WINDOW_AND_SINK,
            "Rolling Forcing's anchor (un-roped, re-roped)",
            needs_sink=True,
            rebuilds_keys=True,
        ),
        # sink_frames: the re-inserted segment (Rolling Sink has no fixed sink: its
        # reference runs a plain 21-frame FIFO window with sink_size 0).
        PolicySpec(
            ROLLING_SINK,
            _defaults(21, 3),
            _WINDOW_AND_SINK,
            "Rolling Sink: first-window segments re-inserted",
            needs_sink=True,
            keeps_first_window=True,
            rebuilds_keys=True,
        ),
        PolicySpec(
            RELATIVE_ROPE, _defaults(6, 1), _WINDOW_AND_SINK, "Infinity-RoPE: block-relativistic RoPE", needs_sink=True
        ),
        PolicySpec(
            EMA_SINK,
            _defaults(9, 3),
            _WINDOW_AND_SINK,
            "Reward Forcing: evicted frames blended into the sink",
            needs_sink=True,
        ),
        # local_attn_frames: the span a call attends (their max_attention_size, 21 frames);
        # sink_frames: the anchor (block 0). The cache holds both: 24 frames (RF pipeline).
        PolicySpec(
            ROLLING_FORCING,
            _defaults(21, 3),
            _WINDOW_AND_SINK,
            "Rolling Forcing: anchor + working cache + window",
            calls=frozenset({CallKind.WINDOW}),
            needs_sink=True,
            holds_anchor_beyond_window=True,
        ),
        # local_attn_frames: the context (one block, Krea's kv_cache_num_frames 3) plus the block.
        PolicySpec(
            KREA_RECOMPUTE,
            _defaults(6),
            ("local_attn_frames",),
            "Krea Realtime: cleared and recomputed from the context frames every block, positions restarting at 0",
            calls=frozenset({CallKind.BLOCK, CallKind.RECOMPUTE}),
            needs_calls=frozenset({CallKind.RECOMPUTE}),
        ),
        # local_attn_frames: the cache and the span a call attends (their local_attn_size 32);
        # sink_frames: the global sink, and the scene-cut sink's length (their sink_size 8).
        PolicySpec(
            LONGLIVE2,
            _defaults(32, 8),
            _WINDOW_AND_SINK,
            "LongLive 2.0: window with a global sink and a scene-cut sink pinned at prompt-marked cuts",
            calls=frozenset({CallKind.BLOCK, CallKind.SHOT}),
            needs_calls=frozenset({CallKind.SHOT}),
            # Their use_relative_rope (keys stored before RoPE, roped at their slot at every
            # call) and kv_quant (the NVFP4 cache).
            options=(
                OptionSpec(
                    "use_relative_rope",
                    False,
                    description="the cache holds keys before RoPE, roped at their slot at every call, the queries at "
                    "the last slots, no shot offset (LongLive 2.0's use_relative_rope).",
                ),
                OptionSpec(
                    "kv_quant",
                    False,
                    description="LongLive 2.0's NVFP4 KV cache (nvfp4_4over6): earlier chunks' keys and values "
                    "quantized, the current chunk's keys mean-centred (docs/longlive2.md).",
                ),
            ),
            needs_sink=True,
        ),
    )
}
CACHE_POLICIES = tuple(CACHE_POLICY_TABLE)


def infer_policy(local_attn_frames: int | None, sink_frames: int | None) -> str:
    """The policy the window keys mean when no ``cache_policy`` is given: a window is
    ``window``, a window with sink frames ``sink``, no window ``global``."""
    if local_attn_frames in (None, -1):
        return GLOBAL
    return SINK if sink_frames else WINDOW


def policy_spec(name: str) -> PolicySpec:
    try:
        return CACHE_POLICY_TABLE[name]
    except KeyError:
        raise OptionsError(
            f"config key generation.cache_policy: {name!r} is not one of {', '.join(CACHE_POLICY_TABLE)}"
        ) from None


class OptionsError(ConfigError):
    """Generation options that cannot run; the message names the config key and value."""


# -- generation procedures -------------------------------------------------------------------


@dataclass(frozen=True)
class ProcedureSpec:
    """One generation procedure, as every planning step sees it (no torch).

    The base class is Self-Forcing's block procedure (per block, one call a denoising step
    and a cache pass); a procedure whose calls differ overrides the methods. Its code is
    the ``Procedure`` registered under ``name`` in ``sinkscope.generation``.
    """

    name: str
    # What it follows, in a few words.
    follows: str = ""
    # The kinds of calls it makes (``CallKind``): it runs the policies that take them all.
    calls: frozenset[str] = frozenset({CallKind.BLOCK})
    # The cache policy it brings (what ``cache_policy: null`` means under it); None: the
    # window keys decide (``infer_policy``).
    cache_policy: str | None = None
    # Whether a video has one prompt (prompt schedules are refused).
    one_prompt: bool = False
    # Whether its code applies ``generation.interventions`` (sinkscope.interventions).
    supports_interventions: bool = True
    # The keys of its own (``OptionSpec``), read by its code (``GenerationOptions.option``).
    options: tuple[OptionSpec, ...] = ()

    def runs(self, policy: PolicySpec) -> bool:
        """Whether the policy takes every kind of call this procedure makes, and this
        procedure makes every kind the policy needs."""
        return self.calls <= policy.calls and policy.needs_calls <= self.calls

    def check(self, options: GenerationOptions) -> None:
        """Refuse options the procedure has no reference for (one line, the key named)."""

    def num_calls(self, options: GenerationOptions) -> int:
        """Calls of one generation with one prompt, as the tables count them."""
        return sum(len(options.block_steps(block)) + 1 for block in range(len(options.block_sizes())))

    def widest_call_frames(self, options: GenerationOptions) -> int:
        """Query frames of its widest model call (re-cache calls aside)."""
        return max(options.block_sizes())

    def needs_vae(self, options: GenerationOptions) -> bool:
        """Whether its generation decodes and re-encodes frames (the job loads the Wan VAE)."""
        return False


@dataclass(frozen=True)
class RollingForcingProcedure(ProcedureSpec):
    """Rolling Forcing's rolling window (``sinkscope.generation.rolling``): only what its
    code does (docs/cache-policies.md)."""

    def check(self, options: GenerationOptions) -> None:
        block, steps = options.frames_per_block, len(options.denoising_steps)
        if options.independent_first_frame:
            raise OptionsError(
                f"config key generation.independent_first_frame: procedure {self.name!r} has blocks of one size "
                "(its anchor and every cached slot are one block)"
            )
        if options.first_block_denoising_steps is not None:
            raise OptionsError(
                f"config key generation.first_block_denoising_steps: procedure {self.name!r} gives every block the "
                "same noise levels (one per window position)"
            )
        if options.sink_frames != block:
            raise OptionsError(
                f"config key generation.sink_frames: {options.sink_frames} must equal frames_per_block = {block} under "
                f"procedure {self.name!r} (the anchor is block 0)"
            )
        blocks = len(options.block_sizes())
        if blocks < steps:
            raise OptionsError(
                f"config key generation.num_frames: {options.num_frames} frames are {blocks} blocks, fewer than the "
                f"{steps} denoising steps (the rolling window holds {steps} blocks)"
            )
        span, need = options.local_attn_frames, (steps + 1) * block
        if span < need or span % block:
            raise OptionsError(
                f"config key generation.local_attn_frames: {span} must be a multiple of frames_per_block = {block} "
                f"and at least {need} (the anchor plus a window of {steps} blocks)"
            )

    def num_calls(self, options: GenerationOptions) -> int:
        """nb + W - 1 windows, each one table call per block it holds (nb W in all) and one cache update."""
        blocks, steps = len(options.block_sizes()), len(options.denoising_steps)
        return blocks * steps + blocks + steps - 1

    def widest_call_frames(self, options: GenerationOptions) -> int:
        return max(options.block_sizes()) * len(options.denoising_steps)  # a full window


@dataclass(frozen=True)
class KreaRecomputeProcedure(ProcedureSpec):
    """Krea Realtime 14B's KV recomputation (``sinkscope.generation.krea``): per block b >= 1
    one recompute call over the context frames (the cache cleared), then a call per
    denoising step; no cache pass (docs/krea-realtime.md)."""

    def check(self, options: GenerationOptions) -> None:
        block = options.frames_per_block
        if options.independent_first_frame:
            raise OptionsError(
                f"config key generation.independent_first_frame: procedure {self.name!r} has blocks of one size "
                "(its context is one block)"
            )
        if options.local_attn_frames != 2 * block:
            raise OptionsError(
                f"config key generation.local_attn_frames: {options.local_attn_frames} must be 2 x frames_per_block = "
                f"{2 * block} under procedure {self.name!r} (the context, one block, plus the block)"
            )

    def num_calls(self, options: GenerationOptions) -> int:
        """A call per denoising step of every block, and a recompute call before every block but the first."""
        blocks = len(options.block_sizes())
        return sum(len(options.block_steps(block)) for block in range(blocks)) + blocks - 1

    def needs_vae(self, options: GenerationOptions) -> bool:
        """The re-encode of the oldest context frame, from the third block on."""
        return options.option("recompute_context") == "reencode" and options.num_frames > 2 * options.frames_per_block


def unipc_timesteps(num_steps: int, shift: float, num_train_timesteps: int = 1000) -> tuple[int, ...]:
    """The model timesteps of LongLive 2.0's UniPC flow schedule, without torch (equal to
    ``sinkscope.generation.unipc.flow_unipc_schedule``'s; a test checks it): 999, 937, 833,
    624 for 4 steps at shift 5."""
    sigma_max = struct.unpack("f", struct.pack("f", 1.0 - 1.0 / num_train_timesteps))[0]  # float32, as their table
    spacing = -sigma_max / num_steps
    unshifted = [k * spacing + sigma_max for k in range(num_steps)]
    return tuple(int(shift * u / (1 + (shift - 1) * u) * num_train_timesteps) for u in unshifted)


@dataclass(frozen=True)
class LongLive2Procedure(ProcedureSpec):
    """LongLive 2.0's chunks (``sinkscope.generation.longlive2``): per chunk a new UniPC
    sampler, a call per step, then the clean cache pass (docs/longlive2.md)."""

    def check(self, options: GenerationOptions) -> None:
        if options.independent_first_frame:
            raise OptionsError(
                f"config key generation.independent_first_frame: procedure {self.name!r} has chunks of one size"
            )
        if options.first_block_denoising_steps is not None:
            raise OptionsError(
                f"config key generation.first_block_denoising_steps: procedure {self.name!r} builds the "
                "same sampler for every chunk"
            )
        expected = unipc_timesteps(len(options.denoising_steps), options.timestep_shift, options.num_train_timesteps)
        if options.denoising_steps != expected:
            raise OptionsError(
                f"config key generation.denoising_steps: {list(options.denoising_steps)} are not the UniPC timesteps "
                f"of {len(options.denoising_steps)} steps at timestep_shift {options.timestep_shift:g} under "
                f"procedure {self.name!r}: {list(expected)}"
            )


# One entry a procedure; its ``Procedure`` is registered under the same name (``sinkscope.generation``).
PROCEDURE_TABLE: dict[str, ProcedureSpec] = {
    spec.name: spec
    for spec in (
        ProcedureSpec(
            SELF_FORCING_PROCEDURE, "Self-Forcing: block by block, a call per denoising step, then the cache pass"
        ),
        RollingForcingProcedure(
            ROLLING_FORCING_PROCEDURE,
            "Rolling Forcing: a window of len(denoising_steps) blocks denoised jointly at staggered noise levels, "
            "sliding one block a call; blocks of one size, sink_frames = frames_per_block",
            calls=frozenset({CallKind.WINDOW}),
            cache_policy=ROLLING_FORCING,
            one_prompt=True,
            supports_interventions=False,
        ),
        KreaRecomputeProcedure(
            KREA_RECOMPUTE,
            "Krea Realtime 14B: before every block the cache is cleared and rebuilt from one block of context frames "
            "at t = 0, pass recompute, positions restarting at 0; then a call per step; local_attn_frames = 2 x "
            "frames_per_block; docs/krea-realtime.md",
            calls=frozenset({CallKind.BLOCK, CallKind.RECOMPUTE}),
            cache_policy=KREA_RECOMPUTE,
            one_prompt=True,
            options=(
                OptionSpec(
                    "recompute_context",
                    RECOMPUTE_CONTEXTS[0],
                    RECOMPUTE_CONTEXTS,
                    omit_default=False,
                    description="the oldest context frame (from the third block on) is the VAE re-encoding of its "
                    "last decoded video frame (reencode, Krea's code; needs Wan2.1_VAE.pth in the base folder) or the "
                    "latent itself (latent: no VAE, a deviation).",
                ),
            ),
        ),
        LongLive2Procedure(
            LONGLIVE2,
            "LongLive 2.0: chunk by chunk, a UniPC flow sampler with denoising_steps its timesteps, e.g. [999, 937, "
            "833, 624], then the clean cache pass at t = 0; a chunk whose prompt starts with 'The scene transitions. ' "
            "starts a shot; docs/longlive2.md",
            calls=frozenset({CallKind.BLOCK, CallKind.SHOT}),
            cache_policy=LONGLIVE2,
        ),
    )
}


def procedure_spec(name: str) -> ProcedureSpec:
    try:
        return PROCEDURE_TABLE[name]
    except KeyError:
        raise OptionsError(
            f"config key generation.procedure: {name!r} is not one of {', '.join(PROCEDURE_TABLE)}"
        ) from None


def procedures_running(policy: str) -> tuple[str, ...]:
    """The procedures that run cache policy ``policy`` (``ProcedureSpec.runs``)."""
    spec = policy_spec(policy)
    return tuple(name for name, procedure in PROCEDURE_TABLE.items() if procedure.runs(spec))


def block_cache_policies() -> tuple[str, ...]:
    """The policies Self-Forcing's block procedure runs: those that take block calls and need
    no other kind of call (``needs_calls``)."""
    procedure = PROCEDURE_TABLE[SELF_FORCING_PROCEDURE]
    return tuple(name for name, spec in CACHE_POLICY_TABLE.items() if procedure.runs(spec))


def option_owners() -> dict[str, tuple[str, str, OptionSpec]]:
    """Every declared key -> (what declares it, 'cache_policy' or 'procedure'; its name; its spec)."""
    owners: dict[str, tuple[str, str, OptionSpec]] = {}
    for kind, table in (("cache_policy", CACHE_POLICY_TABLE), ("procedure", PROCEDURE_TABLE)):
        for name, spec in table.items():
            for option in spec.options:
                if option.key in owners:  # the schema and the refusals name one owner a key
                    raise ValueError(f"key {option.key!r} is declared by {owners[option.key][1]!r} and {name!r}")
                owners[option.key] = (kind, name, option)
    return owners


def missing_reencode_vae(where: str, whose: str, looked: str) -> str:
    """The one line for a run whose procedure re-encodes frames (``ProcedureSpec.needs_vae``)
    where there is no Wan VAE: at the check, in the job, and for a direct call without one."""
    return (
        f"config key {where}: 'reencode' needs {whose} Wan VAE ({looked}); set recompute_context: latent to keep "
        "the latent instead"
    )


@dataclass(frozen=True)
class GenerationOptions:
    """How a video is generated; field names are the config's ``generation:`` keys.

    Construct with ``from_config`` (it fills in the policy's published defaults); built
    directly, a bounded policy needs its window keys spelled out. The fields hold
    resolved values only, so ``to_dict()`` is canonical. The keys that one policy or
    procedure declares (``OptionSpec``: ``kv_quant``, ``recompute_context``...) are held in
    ``declared``, (key, value) pairs of the policy's and the procedure's own keys, each
    resolved (``option(key)``).
    """

    num_frames: int = 21
    frames_per_block: int = 3
    independent_first_frame: bool = False
    denoising_steps: tuple[int, ...] = (1000, 750, 500, 250)
    # The first block's steps when they differ (Causal Forcing++'s
    # denoising_step_list_first_chunk: 4 steps for block 0 of its 1- and 2-step models).
    first_block_denoising_steps: tuple[int, ...] | None = None
    warp_denoising_step: bool = True
    timestep_shift: float = 5.0
    num_train_timesteps: int = 1000
    context_noise: float = 0.0
    # None infers the policy from the window keys: a window is 'window', with sinks 'sink'.
    cache_policy: str | None = None
    # Frames the KV cache holds (sink included); -1: every frame (global).
    local_attn_frames: int = -1
    # Frames kept at the start of the cache (the sink), never evicted; rolling_sink: the
    # frames of the re-inserted segment.
    sink_frames: int = 0
    # Participative compression: frames' worth of tokens kept when compressing, and
    # how many of them are the most recent frames (the current block included).
    budget_frames: int = 0
    recent_frames: int = 0
    # Latent grid; None takes the model config's (60 x 104 for 480 x 832 video).
    latent_height: int | None = None
    latent_width: int | None = None
    # At a prompt switch, recompute the kept frames' keys/values under the new prompt
    # (LongLive's KV re-cache); False only switches the cross-attention context.
    re_cache: bool = True
    # How the calls are made: a name of ``PROCEDURE_TABLE``.
    procedure: str = SELF_FORCING_PROCEDURE
    # Edits applied while the video is generated (sinkscope.interventions); () none.
    interventions: tuple[Edit, ...] = ()
    # The policy's and the procedure's own keys: (key, value) pairs, or a mapping of the
    # ones given (the others take their defaults).
    declared: tuple[tuple[str, Any], ...] | Mapping[str, Any] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "denoising_steps", tuple(int(s) for s in self.denoising_steps))
        first = self.first_block_denoising_steps
        if first is not None:
            first = tuple(int(s) for s in first)
            # One form for equal options: the first block's steps only when they differ.
            object.__setattr__(self, "first_block_denoising_steps", None if first == self.denoising_steps else first)
        object.__setattr__(self, "timestep_shift", float(self.timestep_shift))
        object.__setattr__(self, "context_noise", float(self.context_noise))
        if self.cache_policy is None:
            brought = PROCEDURE_TABLE[self.procedure].cache_policy if self.procedure in PROCEDURE_TABLE else None
            inferred = brought or infer_policy(self.local_attn_frames, self.sink_frames)
            object.__setattr__(self, "cache_policy", inferred)
        self.block_sizes()  # validates the frame counts
        if not self.denoising_steps:
            raise OptionsError("config key generation.denoising_steps: name at least one step")
        if self.first_block_denoising_steps == ():
            raise OptionsError("config key generation.first_block_denoising_steps: name at least one step, or null")
        policy_spec(self.cache_policy).check(self)
        self._check_procedure()
        try:
            object.__setattr__(
                self, "interventions", parse_interventions(self.interventions, "generation.interventions")
            )
        except ConfigError as exc:
            raise OptionsError(str(exc)) from None
        self._check_interventions()

    # -- construction ------------------------------------------------------------------

    @classmethod
    def from_config(cls, data: Mapping[str, Any], *, cleared: Collection[str] = ()) -> GenerationOptions:
        """Options from a ``generation:`` mapping; ``None`` values take the policy's defaults.

        Without ``cache_policy`` the window keys decide: a window (``local_attn_frames``) is
        ``window``, a window with ``sink_frames`` is ``sink``, no window ``global``.
        ``cleared``: the window keys a variant (or a checkpoint's ``generation:``) set to null
        over the base: refused where the policy reads them and holds a window, since null
        there would quietly take the policy's default, not leave the window out.
        """
        fields = {f.name for f in dataclasses.fields(cls)} - {"declared"}
        owners = option_owners()
        known = fields | set(owners)
        unknown = sorted(set(data) - known)
        if unknown:
            raise OptionsError(f"unknown config key generation.{unknown[0]} (known: {', '.join(sorted(known))})")
        values = {k: v for k, v in data.items() if v is not None}
        procedure = PROCEDURE_TABLE.get(values.get("procedure", SELF_FORCING_PROCEDURE))
        if values.get("cache_policy") is None and procedure is not None and procedure.cache_policy is not None:
            values["cache_policy"] = procedure.cache_policy  # the procedure's own cache
        inferred = values.get("cache_policy") is None
        policy = (
            infer_policy(values.get("local_attn_frames"), values.get("sink_frames"))
            if inferred
            else values["cache_policy"]
        )
        spec = policy_spec(policy)
        for key in POLICY_KEYS:
            if inferred and key == "sink_frames":
                continue  # the inference read it; a sink without a window gets its own message below
            if key in values and key not in spec.keys and values[key] != spec.defaults[key]:
                raise OptionsError(
                    f"config key generation.{key}: {values[key]} has no meaning for cache_policy {policy!r} "
                    f"(it uses {', '.join(spec.keys) or 'none of the window keys'})"
                )
        for key in cleared:
            if key in spec.keys and spec.bounded and key not in values:
                raise OptionsError(
                    f"config key generation.{key}: null under cache_policy {policy!r} would quietly take the "
                    f"policy's default {spec.defaults[key]} (null is not 'none' there); write the value, or leave "
                    "the key out to keep the one it overrides"
                )
        declared = {key: values.pop(key) for key in list(values) if key in owners}
        resolved = {**spec.defaults, **values, "cache_policy": policy}
        return cls(**resolved, declared=declared)

    def to_dict(self) -> dict[str, Any]:
        """Canonical, JSON-ready: every field resolved, numbers in their declared type; the
        procedure's own keys after ``procedure``, the policy's after ``interventions``, each
        left out where its spec says so at its default."""
        data: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            if field.name not in ("declared", "interventions"):
                data[field.name] = getattr(self, field.name)
        data["denoising_steps"] = list(self.denoising_steps)
        if self.first_block_denoising_steps is not None:
            data["first_block_denoising_steps"] = list(self.first_block_denoising_steps)
        if self.procedure == SELF_FORCING_PROCEDURE:
            del data["procedure"]  # the default: rule params of runs without the key stay the same
        data.update(self._declared_params(procedure_spec(self.procedure).options))
        if self.interventions:
            data["interventions"] = [edit.to_config() for edit in self.interventions]
        data.update(self._declared_params(policy_spec(self.cache_policy).options))
        return data

    def _declared_params(self, specs: Sequence[OptionSpec]) -> dict[str, Any]:
        values = dict(self.declared)
        return {
            spec.key: values[spec.key] for spec in specs if not (spec.omit_default and values[spec.key] == spec.default)
        }

    def option(self, key: str) -> Any:
        """The value of ``key``, declared by the policy or the procedure in use (``OptionSpec``)."""
        for name, value in self.declared:
            if name == key:
                return value
        raise KeyError(
            f"{key!r} is declared by neither cache_policy {self.cache_policy!r} nor procedure {self.procedure!r}"
        )

    def policy_options(self) -> dict[str, Any]:
        """The policy's own keys and their values: the keywords its class takes beside the window's."""
        values = dict(self.declared)
        return {spec.key: values[spec.key] for spec in policy_spec(self.cache_policy).options}

    # -- derived -------------------------------------------------------------------------

    def block_sizes(self) -> list[int]:
        """Frames generated together, in order; they sum to num_frames."""
        n, b = self.num_frames, self.frames_per_block
        if n < 1 or b < 1:
            raise OptionsError(f"config keys generation.num_frames ({n}) and frames_per_block ({b}) must be positive")
        if self.independent_first_frame:
            if (n - 1) % b:
                raise OptionsError(
                    f"config key generation.num_frames: with independent_first_frame, num_frames - 1 = {n - 1} "
                    f"must be a multiple of frames_per_block = {b} (e.g. num_frames = {1 + b * max(1, (n - 1) // b)})"
                )
            return [1] + [b] * ((n - 1) // b)
        if n % b:
            raise OptionsError(
                f"config key generation.num_frames: {n} must be a multiple of frames_per_block = {b} "
                f"(e.g. {b * max(1, n // b)})"
            )
        return [b] * (n // b)

    @property
    def rolling(self) -> bool:
        """True when the cache holds fewer frames than the video (frames are evicted)."""
        return self.local_attn_frames != -1

    @property
    def cache_frames(self) -> int:
        """Frames' worth of key slots the cache needs."""
        return self.num_frames if self.local_attn_frames == -1 else min(self.local_attn_frames, self.num_frames)

    @property
    def cache_capacity_frames(self) -> int:
        """Frames' worth of key slots the policy's cache allocates (``PolicySpec.capacity_frames``)."""
        return policy_spec(self.cache_policy).capacity_frames(
            num_frames=self.num_frames,
            local_attn_frames=self.local_attn_frames,
            largest_block=max(self.block_sizes()),
            sink_frames=self.sink_frames,
        )

    @property
    def kv_cache_frames(self) -> int:
        """Frames' worth of keys and values the policy keeps on the device (``PolicySpec.kv_frames``)."""
        return policy_spec(self.cache_policy).kv_frames(
            num_frames=self.num_frames,
            local_attn_frames=self.local_attn_frames,
            sink_frames=self.sink_frames,
            largest_block=max(self.block_sizes()),
        )

    def block_steps(self, block: int) -> tuple[int, ...]:
        """The denoising steps of block ``block`` (the first block's may differ)."""
        if block == 0 and self.first_block_denoising_steps is not None:
            return self.first_block_denoising_steps
        return self.denoising_steps

    @property
    def rolling_forcing(self) -> bool:
        """Whether the calls follow Rolling Forcing's rolling window (``procedure``)."""
        return self.procedure == ROLLING_FORCING_PROCEDURE

    @property
    def num_calls(self) -> int:
        """Calls of one generation with one prompt, as the tables count them (the
        procedure's ``ProcedureSpec.num_calls``): Self-Forcing's, per block every denoising
        step plus the cache pass."""
        return procedure_spec(self.procedure).num_calls(self)

    @property
    def recaches(self) -> bool:
        """Whether a prompt switch recomputes the kept frames (``re_cache`` under a policy
        that allows it; ``check_recache`` refuses the other combinations)."""
        return self.re_cache and policy_spec(self.cache_policy).recaches

    def calls(self, switch_frames: Sequence[int] = ()) -> int:
        """Model calls of one generation whose prompt switches at ``switch_frames``: one
        re-cache call more per switch when the options re-cache."""
        return self.num_calls + (len(switch_frames) if self.recaches else 0)

    def recache_frames(self, switch_frame: int) -> int:
        """Frames a re-cache at ``switch_frame`` recomputes: the last min(W, F) frames
        generated (every frame under ``global``), as LongLive's interactive pipeline."""
        return switch_frame if self.local_attn_frames == -1 else min(self.local_attn_frames, switch_frame)

    def largest_call_frames(self, switch_frames: Sequence[int] = ()) -> int:
        """Query frames of the widest model call: a block, or a re-cache call."""
        widest = procedure_spec(self.procedure).widest_call_frames(self)
        if self.recaches:
            widest = max([widest, *(self.recache_frames(f) for f in switch_frames)])
        return widest

    def check_prompt_switches(self, switch_frames: Sequence[int]) -> None:
        """Refuse prompt switches the procedure or the policy cannot do (one line, the key named)."""
        procedure = procedure_spec(self.procedure)
        if switch_frames and procedure.one_prompt:
            raise OptionsError(
                f"config key generation.procedure: {self.procedure!r} generates a video under one prompt (its "
                "reference has no prompt switches)"
            )
        self.check_recache(switch_frames)

    def check_recache(self, switch_frames: Sequence[int]) -> None:
        """Refuse a re-cache the policy cannot do (its cache holds moved, blended, compacted
        or re-inserted keys): only when the prompt switches."""
        if switch_frames and self.re_cache and not policy_spec(self.cache_policy).recaches:
            recaching = [name for name, spec in CACHE_POLICY_TABLE.items() if spec.recaches]
            raise OptionsError(
                f"config key generation.re_cache: true needs cache_policy {', '.join(map(repr, recaching))} "
                f"(the KV re-cache of LongLive), not {self.cache_policy!r}; set re_cache: false to only switch the "
                "prompt"
            )

    def block_starts(self) -> list[int]:
        """The first frame of every block."""
        starts, frame = [], 0
        for size in self.block_sizes():
            starts.append(frame)
            frame += size
        return starts

    # -- checks ----------------------------------------------------------------------------

    def _check_procedure(self) -> None:
        """The procedure runs the policy (it makes the calls the policy takes), the keys they
        declare, and the procedure's own checks."""
        procedure, policy = procedure_spec(self.procedure), self.cache_policy
        spec = policy_spec(policy)
        if not procedure.runs(spec):
            if procedure.cache_policy is not None:
                raise OptionsError(
                    f"config key generation.cache_policy: {policy!r} cannot run under procedure {procedure.name!r}, "
                    f"whose cache is {procedure.cache_policy!r} (leave cache_policy out, or set it to "
                    f"{procedure.cache_policy!r})"
                )
            untaken, missing = procedure.calls - spec.calls, spec.needs_calls - procedure.calls
            why = f"takes no {_kinds(untaken)} calls" if untaken else f"needs {_kinds(missing)} calls too"
            raise OptionsError(
                f"config key generation.procedure: {procedure.name!r} cannot run cache_policy {policy!r}, which "
                f"{why} (the procedure makes {_kinds(procedure.calls)} calls)"
            )
        self._resolve_declared(procedure, spec)
        procedure.check(self)

    def _resolve_declared(self, procedure: ProcedureSpec, policy: PolicySpec) -> None:
        """``declared``: every key of the procedure and of the policy, given or defaulted; a key
        another policy or procedure declares is refused at a value other than its default."""
        given = dict(self.declared)
        owners = option_owners()
        for key, value in given.items():
            if key not in owners:
                raise OptionsError(f"unknown config key generation.{key}")
            owners[key][2].check(value)
        own = {option.key: option for option in (*procedure.options, *policy.options)}
        for key, value in given.items():
            kind, owner, option = owners[key]
            if key not in own and value != option.default:
                where = (
                    f"for cache_policy {policy.name!r}"
                    if kind == "cache_policy"
                    else f"under procedure {procedure.name!r}"
                )
                raise OptionsError(f"config key generation.{key}: has no meaning {where} (it is {owner!r}'s)")
        resolved = tuple((key, given.get(key, option.default)) for key, option in own.items())
        object.__setattr__(self, "declared", resolved)

    def _check_interventions(self) -> None:
        """Edits the procedure can run, on frames the video has and a later block sees; a
        replacing frame earlier than every frame it replaces. Heads are checked against the
        model by ``sinkscope.pipeline.config``."""
        if not self.interventions:
            return
        if not procedure_spec(self.procedure).supports_interventions:
            raise OptionsError(
                f"config key generation.interventions: procedure {self.procedure!r} cannot apply edits "
                "(use procedure self_forcing)"
            )
        last_start = self.block_starts()[-1]
        for index, edit in enumerate(self.interventions):
            where = f"config key generation.interventions[{index}]"
            if isinstance(edit, CACHE_EDITS) and policy_spec(self.cache_policy).rebuilds_keys:
                raise OptionsError(
                    f"{where}: cache_policy {self.cache_policy!r} re-ropes keys from its own un-roped copy, "
                    f"which {edit.edit} does not reach"
                )
            frames = getattr(edit, "key_frames", FrameSelection("cached"))
            if frames.kind == "list":
                past = [frame for frame in frames.frames if frame >= self.num_frames]
                if past:
                    raise OptionsError(
                        f"{where}.key_frames: frame {past[0]} is past the video's last frame {self.num_frames - 1}"
                    )
                never = [frame for frame in frames.frames if frame >= last_start]
                if never:
                    raise OptionsError(
                        f"{where}.key_frames: frame {never[0]} is in the last block (frames {last_start}-"
                        f"{self.num_frames - 1}), which no later block sees: edits touch cached frames only"
                    )
            if isinstance(edit, ReplaceFrames) and edit.source != "noise":
                if frames.kind != "list":
                    raise OptionsError(
                        f"{where}.source: frame {edit.source} must be earlier than every frame it replaces, "
                        f"and key_frames {frames.kind!r} holds frame 0; list the frames"
                    )
                if edit.source >= min(frames.frames):
                    raise OptionsError(
                        f"{where}.source: frame {edit.source} must be earlier than every frame it replaces "
                        f"(key_frames {list(frames.frames)})"
                    )

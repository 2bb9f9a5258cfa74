"""Every figure kind, declared once: what it is drawn for, the tables it reads, the
options it draws with.

The workflow's targets, inputs and rule params, the plotting API (``sinkscope.plot``)
and the command line (``sinkscope figure``) all derive from ``FIGURES``; adding a kind is
one entry here plus its drawing module ``sinkscope.figures.<name>``. No imports beyond
the standard library, so the Snakefile reads it while it parses.
"""

from __future__ import annotations

from dataclasses import dataclass

# What one figure is drawn for.
SOURCE, LAYER, CHECKPOINT, STUDY = "source", "layer", "checkpoint", "study"
# One checkpoint's variants for one prompt and seed, from their videos or latents (drawn by
# the video rules, not from tables: sinkscope.pipeline.video).
RUN = "run"
# One checkpoint's sweeps (``sweeps:``, sinkscope.sweeps) over the kind's ``sweep_axes``,
# from their atlas table: drawn where the checkpoint has such a sweep, a row of panels each.
SWEEP = "sweep"
# Options every figure takes (the ``figures:`` keys of the config).
COMMON_OPTIONS = ("dpi", "frame_base")
# The other ``figures:`` keys a kind may draw with, in the order rule params list them.
DRAWING_OPTIONS = ("step", "metric", "heads", "video_frames", "highlight_layers")


@dataclass(frozen=True)
class FigureKind:
    name: str
    # SOURCE: one checkpoint and variant, every layer; LAYER: one layer of a source;
    # CHECKPOINT: the variants of one checkpoint side by side; STUDY: its checkpoints;
    # RUN: the variants of one checkpoint for one prompt and seed (their frames); SWEEP:
    # one checkpoint's sweeps over ``sweep_axes``.
    scope: str
    # The tables it reads (layer figures: the frame_attention rows of their layer, read
    # from the extraction files).
    tables: tuple[str, ...]
    # The ``DRAWING_OPTIONS`` it draws with; changing any other reruns nothing.
    options: tuple[str, ...]
    # One line: what it shows (the CLI's help, the docs).
    shows: str
    # Options the plotting API and the CLI take but the pipeline leaves at the kind's own
    # default (key_frame_maps shows softmax mass unless asked for another metric);
    # ``generation``: the source's generation options, which the workflow passes too.
    extra_options: tuple[str, ...] = ()
    # Tables it reads when given: the workflow gives them; without them (the plotting
    # API, the CLI) it derives what it needs from the tables above. head_diagnostics
    # gives each head's class, so that only sink-class heads are called sinks.
    uses: tuple[str, ...] = ()
    # What it compares (CHECKPOINT: "variants", STUDY: "checkpoints"): drawn only when
    # there are at least two of them.
    compares: str | None = None
    # Drawn only when a prompt of the study switches (prompts: schedules).
    needs_prompt_switches: bool = False
    # Drawn only when the config names a label file (diagnostics.reference_labels), which
    # the workflow hands it beside its tables.
    needs_reference_labels: bool = False
    # SWEEP: the axes of the sweeps it draws (sinkscope.sweeps: head, layer, frame, ranked).
    sweep_axes: tuple[str, ...] = ()

    @property
    def inputs(self) -> tuple[str, ...]:
        """Every table the workflow hands it."""
        return (*self.tables, *self.uses)

    @property
    def needs_token_profiles(self) -> bool:
        return "token_profiles" in self.tables

    @property
    def draws_heads(self) -> bool:
        """Draws the chosen heads (``figures.heads``), one panel each."""
        return "heads" in self.options


_STEP_METRIC = ("step", "metric")
_HEADS = ("step", "metric", "heads")
_CLASSES = ("head_diagnostics",)
FIGURES: dict[str, FigureKind] = {
    kind.name: kind
    for kind in (
        FigureKind(
            "figure4",
            SOURCE,
            ("frame_attention",),
            _HEADS,
            "Deep Forcing Figure 4: the last block's attention to each key frame, one panel per head",
            uses=_CLASSES,
        ),
        FigureKind(
            "figure4_tokens",
            SOURCE,
            ("token_profiles", "frame_attention"),
            _HEADS,
            "Figure 4 at token resolution",
            uses=_CLASSES,
        ),
        FigureKind(
            "figure4_steps",
            SOURCE,
            ("frame_attention",),
            ("metric", "heads"),
            "Figure 4 at every denoising step and the cache pass",
            uses=_CLASSES,
        ),
        FigureKind(
            "key_frame_maps",
            SOURCE,
            ("token_profiles", "frame_attention"),
            ("step", "heads"),
            "token profiles of each head's most attended key frames on the patch grid",
            extra_options=("metric",),
            uses=_CLASSES,
        ),
        FigureKind(
            "layer_comparison",
            SOURCE,
            ("frame_attention",),
            (*_STEP_METRIC, "highlight_layers"),
            "layers x key frames, and chosen layers as curves",
        ),
        FigureKind(
            "first_middle_last",
            SOURCE,
            ("frame_attention",),
            ("step",),
            "first, middle, last and own frames of each layer's head-averaged curve, in softmax mass "
            "(--metric logit_mean: in logits, layers whose mass disagrees marked)",
            extra_options=("metric",),
        ),
        FigureKind(
            "sink_score_overview",
            SOURCE,
            ("frame_attention",),
            ("step",),
            "first - middle cache frames of every layer x head in softmax mass, sink-class heads outlined "
            "(--metric logit_mean: in logits, heads whose mass disagrees marked)",
            uses=_CLASSES,
            extra_options=("metric",),
        ),
        FigureKind("head_classes", SOURCE, ("head_diagnostics",), ("step",), "layers x heads coloured by head class"),
        FigureKind(
            "label_agreement",
            SOURCE,
            ("head_diagnostics",),
            ("step",),
            "a published label file (diagnostics.reference_labels) against head_class and pyramid_label",
            needs_reference_labels=True,
        ),
        FigureKind(
            "entropy_overview", SOURCE, ("head_diagnostics",), ("step",), "attention entropy of every layer x head"
        ),
        FigureKind(
            "attention_over_time",
            SOURCE,
            ("frame_attention",),
            ("step", "heads"),
            "blocks x absolute key frames of the chosen heads",
            uses=_CLASSES,
        ),
        FigureKind(
            "cache_timeline",
            SOURCE,
            ("frame_attention",),
            ("step",),
            "blocks x absolute key frames the KV cache holds, at their RoPE positions, marked sink, window, "
            "kept in part, edited",
            extra_options=("generation",),
        ),
        FigureKind(
            "per_head_grid",
            LAYER,
            ("frame_attention",),
            _STEP_METRIC,
            "one layer: every head's Figure 4 bars (softmax mass on one y scale, logits each on its own)",
            uses=_CLASSES,
        ),
        FigureKind(
            "heads_heatmap",
            LAYER,
            ("frame_attention",),
            _STEP_METRIC,
            "one layer: heads x key frames of the last block",
            uses=_CLASSES,
        ),
        FigureKind(
            "query_key_maps",
            LAYER,
            ("frame_attention",),
            (*_STEP_METRIC, "video_frames"),
            "one layer: query x key frame maps over the whole generation",
            uses=_CLASSES,
        ),
        FigureKind(
            "sink_mass_over_time",
            CHECKPOINT,
            ("block_stats",),
            ("step",),
            "mass on the sink frames (frame 0 without sinks) block by block, and its excess over uniform, "
            "one line per variant",
        ),
        FigureKind(
            "sink_collapse",
            CHECKPOINT,
            ("block_stats",),
            ("step",),
            "sink mass, the latents' similarity to the sink frames and to the previous block, and RoPE turns, "
            "on one time axis",
        ),
        FigureKind(
            "policy_comparison",
            CHECKPOINT,
            ("frame_attention",),
            _HEADS,
            "Figure 4 of the last block, one row per variant (a cache policy, an edit, a length)",
            uses=_CLASSES,
            compares="variants",
        ),
        FigureKind(
            "prompt_switch",
            CHECKPOINT,
            ("frame_attention",),
            ("step",),
            "around each prompt switch: sink mass and mass on pre-switch frames block by block, per variant",
            needs_prompt_switches=True,
        ),
        FigureKind(
            "variant_drift",
            CHECKPOINT,
            ("variant_effects",),
            (),
            "latent distance of each edited variant to the untouched video over latent frames, bands across "
            "runs, block boundaries marked",
            compares="variants",
        ),
        FigureKind(
            "attention_shift",
            CHECKPOINT,
            ("variant_head_effects",),
            (),
            "layer x head maps of each variant's change of frame-0 mass against the untouched run, edited heads "
            "outlined",
            compares="variants",
        ),
        FigureKind(
            "head_atlas",
            SWEEP,
            ("head_atlas",),
            (),
            "layers x heads of the drift each head's edit alone gives the video, sink-class heads outlined, "
            "and that drift against the head's untouched frame-0 mass",
            sweep_axes=("head", "layer"),
        ),
        FigureKind(
            "frame_atlas",
            SWEEP,
            ("frame_atlas",),
            (),
            "the drift each cached frame's edit alone gives the video, sink frames marked, above the untouched "
            "run's mass on that frame",
            sweep_axes=("frame",),
        ),
        FigureKind(
            "pruning_curve",
            SWEEP,
            ("pruning_curve",),
            (),
            "drift at the last block against the number of heads edited, taken by least atlas drift, in a random "
            "order and by least frame-0 mass, bands across runs",
            sweep_axes=("ranked",),
        ),
        FigureKind(
            "contact_sheet",
            RUN,
            ("frames",),
            (),
            "every 4th video frame (without a VAE, the latents in a fixed projection to RGB) of one prompt and "
            "seed, one row per variant, the untouched default on top",
        ),
        FigureKind(
            "attention_across_checkpoints",
            STUDY,
            ("head_diagnostics",),
            ("step",),
            "frame-0 mass and entropy per layer across checkpoints (training steps)",
            compares="checkpoints",
        ),
    )
}


def figure_kind(name: str) -> FigureKind:
    try:
        return FIGURES[name]
    except KeyError:
        raise ValueError(f"unknown figure {name!r}; known: {', '.join(FIGURES)}") from None


def kinds(scope: str) -> tuple[str, ...]:
    return tuple(name for name, kind in FIGURES.items() if kind.scope == scope)


SOURCE_FIGURES, LAYER_FIGURES, CHECKPOINT_FIGURES, STUDY_FIGURES, SWEEP_FIGURES = (
    kinds(s) for s in (SOURCE, LAYER, CHECKPOINT, STUDY, SWEEP)
)
TOKEN_FIGURES = tuple(name for name, kind in FIGURES.items() if kind.needs_token_profiles)
SWITCH_FIGURES = tuple(name for name, kind in FIGURES.items() if kind.needs_prompt_switches)
LABEL_FIGURES = tuple(name for name, kind in FIGURES.items() if kind.needs_reference_labels)

"""The figure kinds, by what they are drawn for (no imports: the Snakefile and the
figures package both read them)."""

# Once per source (checkpoint x variant, or imported cache).
SOURCE_FIGURES = (
    "figure4",
    "figure4_tokens",
    "figure4_steps",
    "key_frame_maps",
    "layer_comparison",
    "first_middle_last",
    "sink_score_overview",
    "head_classes",
    "entropy_overview",
    "attention_over_time",
)
# Need token profiles of the last block.
TOKEN_FIGURES = ("figure4_tokens", "key_frame_maps")
# Once per layer of a source.
LAYER_FIGURES = ("per_head_grid", "heads_heatmap", "query_key_maps")
# Once per checkpoint, its variants side by side.
CHECKPOINT_FIGURES = ("sink_mass_over_time", "policy_comparison")
# Once for the study, its checkpoints side by side.
STUDY_FIGURES = ("attention_across_checkpoints",)

"""What the Snakefile needs from a config: target paths, job groups and rule params.

Kept out of the .smk files so that the rules stay declarative and the logic is tested.
The file tree under ``results/`` is defined here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from .config import CheckpointSpec, ConfigError, checkpoint_specs
from .model.loading import resolve_model_config, weights_digest

RESULTS = "results"
# Digests of weight and text-encoder files, reused while their size and mtime hold.
DIGEST_CACHE = ".snakemake/sinkscope/sha256.json"
TABLES = ("frame_attention", "head_stats", "layer_stats")
# Figures drawn once per source (checkpoint or imported cache) and once per layer.
SOURCE_FIGURES = ("figure4", "layer_comparison", "first_middle_last", "sink_score_overview")
LAYER_FIGURES = ("per_head_grid", "heads_heatmap", "query_key_maps")


def encode_layers(layers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2_5_7-8': a compact, path-safe name for a layer group."""
    layers = sorted(layers)
    parts, start = [], None
    for i, layer in enumerate(layers):
        if start is None:
            start = layer
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            parts.append(str(start) if start == layer else f"{start}-{layer}")
            start = None
    return "_".join(parts)


def decode_layers(name: str) -> list[int]:
    layers: list[int] = []
    for part in name.split("_"):
        first, _, last = part.partition("-")
        layers.extend(range(int(first), int(last or first) + 1))
    return layers


@dataclass
class Study:
    """A normalized config seen as a grid of jobs and files."""

    config: Mapping[str, Any]
    base_dir: str = "."

    @cached_property
    def checkpoints(self) -> dict[str, CheckpointSpec]:
        return checkpoint_specs(self.config)

    @property
    def prompts(self) -> dict[str, str]:
        return dict(self.config["prompts"])

    @property
    def seeds(self) -> list[int]:
        return list(self.config["seeds"])

    @property
    def layers(self) -> list[int]:
        return sorted(self.config["layers"])

    @property
    def legacy(self) -> dict[str, dict]:
        return dict(self.config.get("legacy_caches", {}))

    @property
    def sources(self) -> list[str]:
        """Everything that gets tables and figures: checkpoints, then imported caches."""
        return list(self.checkpoints) + list(self.legacy)

    # -- groups of layers per extraction job ---------------------------------------------

    @cached_property
    def layer_groups(self) -> list[list[int]]:
        """Layers captured together: blocks of ``layers_per_job`` consecutive layer
        indices, so adding a layer reruns only the job of its own block."""
        size = int(self.config.get("layers_per_job", 1))
        groups: dict[int, list[int]] = {}
        for layer in self.layers:
            groups.setdefault(layer // size, []).append(layer)
        return [groups[k] for k in sorted(groups)]

    # -- paths -----------------------------------------------------------------------------

    @staticmethod
    def extract_dir(checkpoint: str, prompt: str, seed: int | str, group: str) -> str:
        return f"{RESULTS}/extract/{checkpoint}/{prompt}/seed{seed}/layers{group}"

    @staticmethod
    def layer_file(directory: str, layer: int | str) -> str:
        return f"{directory}/layer{layer}.parquet"

    def extract_dirs(self, checkpoint: str, layer: int | None = None) -> list[str]:
        """Extraction outputs of one checkpoint (only those holding ``layer``, if given)."""
        groups = [encode_layers(g) for g in self.layer_groups if layer is None or layer in g]
        return [
            self.extract_dir(checkpoint, prompt, seed, group) for prompt in self.prompts for seed in self.seeds for group in groups
        ]

    @staticmethod
    def imported_file(name: str) -> str:
        return f"{RESULTS}/imported/{name}/frame_attention.parquet"

    def source_inputs(self, source: str, layer: int | None = None) -> list[str]:
        """The frame-level inputs of a source's aggregation (or of one layer's figures)."""
        if source in self.legacy:
            return [self.imported_file(source)]
        return self.extract_dirs(source, layer)

    @staticmethod
    def checkpoint_table(source: str, table: str) -> str:
        return f"{RESULTS}/tables/checkpoints/{source}/{table}.parquet"

    @staticmethod
    def table(table: str) -> str:
        return f"{RESULTS}/tables/{table}.parquet"

    @staticmethod
    def embedding(encoder: str, prompt: str) -> str:
        return f"{RESULTS}/prompts/{encoder}/{prompt}.safetensors"

    @staticmethod
    def source_figure(source: str, kind: str, ext: str = "svg") -> str:
        return f"{RESULTS}/figures/{source}/{kind}.{ext}"

    @staticmethod
    def layer_figure(source: str, layer: int | str, kind: str, ext: str = "svg") -> str:
        return f"{RESULTS}/figures/{source}/layer{layer}/{kind}.{ext}"

    # -- per-source facts --------------------------------------------------------------------

    @cached_property
    def _model_configs(self):
        return {name: resolve_model_config(spec, self.base_dir) for name, spec in self.checkpoints.items()}

    def model_config(self, checkpoint: str):
        return self._model_configs[checkpoint]

    def text_encoder(self, checkpoint: str):
        from .text import text_encoder_for

        config = self.model_config(checkpoint)
        return text_encoder_for(self.checkpoints[checkpoint], config.text_dim, config.text_len, self.base_dir)

    def weights_sha256(self, checkpoint: str) -> str:
        """The checkpoint's weights digest, cached by file size and mtime."""
        return weights_digest(self.checkpoints[checkpoint], self.base_dir, cache=DIGEST_CACHE)

    def source_layers(self, source: str) -> list[int]:
        if source in self.legacy:
            from .legacy import peek_layers

            path = Path(self.legacy[source]["path"])
            path = path if path.is_absolute() else Path(self.base_dir) / path
            try:
                return peek_layers(path, allow_pickle=self.legacy[source]["allow_pickle"])
            except (ValueError, FileNotFoundError) as error:
                raise ConfigError(f"config key legacy_caches.{source}: {error}") from None
        return self.layers

    # -- targets -----------------------------------------------------------------------------

    def figure_targets(self) -> list[str]:
        paths = []
        for source in self.sources:
            for kind in SOURCE_FIGURES:
                paths += [self.source_figure(source, kind, ext) for ext in ("svg", "png")]
            for layer in self.source_layers(source):
                for kind in LAYER_FIGURES:
                    paths += [self.layer_figure(source, layer, kind, ext) for ext in ("svg", "png")]
        return paths

    def all_targets(self) -> list[str]:
        return [self.table(t) for t in TABLES] + self.figure_targets()

    # -- rule params (what each job depends on, so changes rerun exactly it) ----------------

    def figure_options(self, kind: str) -> dict[str, Any]:
        options = self.config["figures"]
        chosen = {"step": options["step"], "metric": options["metric"], "dpi": options["dpi"]}
        if kind == "figure4":
            chosen["heads"] = list(options["heads"])
        if kind == "query_key_maps":
            chosen["video_frames"] = options["video_frames"]
        return chosen

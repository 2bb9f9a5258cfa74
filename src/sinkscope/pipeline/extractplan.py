"""The extraction stage's plan: prompt embeddings, the extraction folders of each run,
imported caches, and the canonical params of the extraction and aggregation jobs
(equivalent configs give equal params, so nothing reruns for a rewording).

Torch-free: the Snakefile calls it while it parses (rules/extract.smk, aggregate.smk).
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from sinkscope.errors import ConfigError
from sinkscope.model.checkpoints import files_digest, find_vae
from sinkscope.naming import decode_layers, encode_layers
from sinkscope.options import procedure_spec
from sinkscope.pipeline.config import CAPTURE_STATISTICS
from sinkscope.pipeline.grid import DIGEST_CACHE, StudyGrid
from sinkscope.pipeline.layout import SOURCE_TABLES
from sinkscope.pipeline.resources import default_dtype


class ExtractionPlan(StudyGrid):
    """What the extraction, import and aggregation jobs of a study read, write and get."""

    # -- files -------------------------------------------------------------------------------------

    def extract_dirs(self, source: str, layer: int | None = None) -> list[str]:
        """Extraction outputs of one source (only those holding ``layer``, if given)."""
        groups = [encode_layers(g) for g in self.layer_groups if layer is None or layer in g]
        return [
            self.path("extract_dir", source=source, prompt=prompt, seed=seed, group=group)
            for prompt in self.prompts
            for seed in self.seeds
            for group in groups
        ]

    def all_extract_dirs(self) -> list[str]:
        return [d for source in self.runs for d in self.extract_dirs(source)]

    def source_inputs(self, source: str, layer: int | None = None) -> list[str]:
        """The frame-level inputs of a source's aggregation (or of one layer's figures)."""
        if source in self.legacy:
            return [self.path("imported", source=source)]
        return self.extract_dirs(source, layer)

    def source_tables(self, source: str) -> dict[str, str]:
        """The per-source tables the aggregation job writes (named outputs)."""
        return {table: self.path("source_table", source=source, table=table) for table in SOURCE_TABLES}

    def embedding(self, checkpoint: str, prompt: str) -> str:
        """The embedding file of a single prompt."""
        return self.path("embedding", encoder=self.text_encoder(checkpoint).key, prompt=prompt)

    def embeddings(self, checkpoint: str, prompt: str) -> list[str]:
        """The prompt's embedding files: one for a single prompt, one per segment of a schedule."""
        if isinstance(self.config["prompts"][prompt], str):
            return [self.embedding(checkpoint, prompt)]
        key = self.text_encoder(checkpoint).key
        return [
            self.path("segment_embedding", encoder=key, prompt=prompt, segment=i)
            for i in range(len(self.prompt_segments(prompt)))
        ]

    def all_embeddings(self) -> list[str]:
        return sorted(
            {
                file
                for checkpoint in self.checkpoints
                for prompt in self.prompts
                for file in self.embeddings(checkpoint, prompt)
            }
        )

    # -- checkpoints, encoders and their digests ----------------------------------------------------

    def model_config(self, checkpoint: str):
        return self.checkpoints[checkpoint].model_config

    def text_encoder(self, checkpoint: str):
        return self.checkpoints[checkpoint].text_encoder()

    @cached_property
    def encoders(self) -> dict[str, Any]:
        """Text encoder key -> spec, for every checkpoint's encoder."""
        found = {}
        for name in self.checkpoints:
            try:
                encoder = self.text_encoder(name)
            except (FileNotFoundError, ValueError) as error:
                raise ConfigError.invalid([f"config key checkpoints.{name}: {error}"]) from None
            found[encoder.key] = encoder
        return found

    def encoder_sha256(self, key: str) -> str:
        return files_digest(self.encoders[key].files(), cache=Path(self.base_dir) / DIGEST_CACHE)

    def weights_sha256(self, checkpoint: str) -> str:
        """The checkpoint's weights digest, cached by file size and mtime."""
        return self.checkpoints[checkpoint].digest(cache=Path(self.base_dir) / DIGEST_CACHE)

    def files_sha256(self, path: Path) -> str:
        """The digest of a file, or of every file in a folder (a diffusers ``vae/``), cached as
        the weights' are, and kept for this study's life."""
        if path not in self._digests:
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            self._digests[path] = files_digest(files, cache=Path(self.base_dir) / DIGEST_CACHE)
        return self._digests[path]

    def generation_vae_sha256(self, source: str) -> str:
        """The digest of the Wan VAE of a source whose generation runs it (Krea's re-encode of a
        context frame: new VAE bytes rerun its extraction); '' for every other source."""
        options = self.options[source]
        if not procedure_spec(options.procedure).needs_vae(options):
            return ""
        vae = find_vae(self.checkpoints[self.checkpoint_of(source)])
        return "" if vae is None else self.files_sha256(vae)

    # -- job params -------------------------------------------------------------------------------

    def compute(self, checkpoint: str) -> dict[str, str]:
        """Device and dtype the extraction computes in (precision is provenance)."""
        return {"device": self.device, "dtype": default_dtype(self.device, self.checkpoints[checkpoint].spec.dtype)}

    def extract_params(self, source: str, group: str) -> dict[str, Any]:
        checkpoint, variant = self.runs[source]
        capture = self.config["capture"]
        resolved = self.checkpoints[checkpoint]
        # train_step only orders a figure; format 'auto' and the format it detects are one.
        spec = {**resolved.spec.to_dict(), "format": resolved.format}
        spec.pop("train_step", None)
        return {
            "checkpoint": spec,
            "variant": variant,
            "layers": decode_layers(group),
            "generation": self.options[source].to_dict(),
            "capture": {
                **{key: capture[key] for key in ("backend", "attention", "kernels", "compile", "token_profiles")},
                # Only where a study narrows it: a job of every statistic keeps the params it had.
                **(
                    {"statistics": list(capture["statistics"])}
                    if tuple(capture["statistics"]) != CAPTURE_STATISTICS
                    else {}
                ),
            },
            "compute": self.compute(checkpoint),
        }

    def aggregate_params(self, source: str) -> dict[str, Any]:
        options = self.options.get(source)
        return {
            "name": source,
            "sink_frames": options.sink_frames if options is not None else 0,
            "diagnostics": {k: v for k, v in self.config["diagnostics"].items() if k != "reference_labels"},
        }

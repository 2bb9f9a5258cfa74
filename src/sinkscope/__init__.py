"""sinkscope: where does an autoregressive video diffusion transformer look?

Attention-sink analysis of block-causal video diffusion transformers
(Self-Forcing on Wan2.1-T2V-1.3B), packaged as a Snakemake pipeline.
Modules, one job each:

- ``sinkscope.model``: the Wan2.1 transformer, named model configs, weight loading.
- ``sinkscope.generation``: Self-Forcing's block-causal KV-cache generation.
- ``sinkscope.stats``: frame-level attention statistics (CPU reference, CUDA kernel).
- ``sinkscope.capture``: per-call statistics of chosen layers during a generation.
- ``sinkscope.tables``: Parquet tables, schemas, provenance, head/layer statistics.
- ``sinkscope.figures``: every figure, as SVG with editable text and PNG.
- ``sinkscope.legacy``: import of the older extraction scripts' ``.pt`` caches.
"""

__version__ = "0.1.0"

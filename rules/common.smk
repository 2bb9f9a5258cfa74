# Config validation and the helpers every rule uses. The logic lives in the
# sinkscope package (sinkscope.config, sinkscope.workflow); this file wires it in.

import re
import sys

from snakemake.utils import validate

from sinkscope.config import ConfigError, normalize_config
from sinkscope.model.loading import files_digest
from sinkscope.workflow import DIGEST_CACHE, LAYER_FIGURES, SOURCE_FIGURES, Study, decode_layers


def _reject(message):
    # A clear message and no traceback; nothing has run, so no result is touched.
    sys.stderr.write(f"sinkscope: {message}\n")
    sys.exit(1)


try:
    _normalized = normalize_config(config)
except ConfigError as error:
    _reject(error)
config.clear()
config.update(_normalized)
# The ecosystem's check against the same schema (a no-op once normalized).
validate(config, schema="../schemas/config.schema.yaml")

STUDY = Study(config)
ENCODERS, ENCODER_SHA256 = {}, {}
for _name in STUDY.checkpoints:
    try:
        _encoder = STUDY.text_encoder(_name)
    except (FileNotFoundError, ValueError) as error:
        _reject(f"invalid config:\n  config key checkpoints.{_name}: {error}")
    ENCODERS[_encoder.key] = _encoder.to_dict()
    # A digest param, not file inputs: touching the 11 GB encoder reruns nothing.
    ENCODER_SHA256[_encoder.key] = files_digest(_encoder.files(), cache=DIGEST_CACHE)
try:
    TARGETS = STUDY.all_targets()
except ConfigError as error:
    _reject(f"invalid config:\n  {error}")


def _names(values):
    return "|".join(re.escape(str(value)) for value in sorted(values)) or "NONE"


wildcard_constraints:
    checkpoint=_names(STUDY.checkpoints),
    source=_names(STUDY.sources),
    prompt=_names(STUDY.prompts),
    encoder=_names(ENCODERS),
    seed=r"\d+",
    layer=r"\d+",
    group=r"\d+(-\d+)?(_\d+(-\d+)?)*",


def encoder_of(checkpoint):
    return STUDY.text_encoder(checkpoint).key


def embedding_of(wildcards):
    return STUDY.embedding(encoder_of(wildcards.checkpoint), wildcards.prompt)


def weights_sha256(wildcards):
    # A param, not an input: new bytes rerun the checkpoint's jobs, a mere touch does not.
    return STUDY.weights_sha256(wildcards.checkpoint)


def checkpoint_params(wildcards):
    return STUDY.checkpoints[wildcards.checkpoint].to_dict()


def group_layers(wildcards):
    return decode_layers(wildcards.group)


def source_tables(table):
    return [STUDY.checkpoint_table(source, table) for source in STUDY.sources]


def figure_options(wildcards):
    return STUDY.figure_options(wildcards.kind)

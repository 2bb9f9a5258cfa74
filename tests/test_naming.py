"""Names defined once (sinkscope.naming): layer groups, per-layer files, labels, hashes."""

from __future__ import annotations

import random
import re

import pytest

from sinkscope.naming import (
    LAYER_GROUP,
    decode_layers,
    encode_layers,
    head_label,
    is_group_folder,
    is_layer_file,
    layer_file,
    parse_head_label,
    stable_hash,
)


def test_layer_groups_round_trip_and_match_the_wildcard_pattern():
    generator = random.Random(0)
    for _ in range(200):
        layers = sorted(generator.sample(range(40), generator.randint(1, 12)))
        name = encode_layers(layers)
        assert decode_layers(name) == layers and re.fullmatch(LAYER_GROUP, name) and is_group_folder(f"layers{name}")
    assert encode_layers([0, 1, 2, 5, 7, 8]) == "0-2_5_7-8"
    for bad in ("layers", "layers0-", "layers_1", "layers0__1", "layer0"):
        assert not is_group_folder(bad), bad


def test_layer_files_are_recognised_by_kind():
    for kind in ("frames", "queries", "tokens"):
        assert is_layer_file(layer_file("d", 7, kind).split("/")[-1])
    assert not is_layer_file("layer7.other.parquet") and not is_layer_file("manifest.json")


@pytest.mark.parametrize("layer, head", [(0, 0), (4, 9), (29, 11)])
def test_paper_labels_are_one_based(layer, head):
    assert parse_head_label(head_label(layer, head)) == (layer, head)


def test_stable_hash_ignores_key_order():
    assert (
        stable_hash({"a": 1, "b": [1, 2]}) == stable_hash({"b": [1, 2], "a": 1}) != stable_hash({"a": 2, "b": [1, 2]})
    )

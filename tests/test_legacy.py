"""Import of the older extraction scripts' .pt caches (sinkscope.legacy).

Small caches in each of the three layouts are written with torch.save, imported, and
compared with values computed the way the seed notebooks compute them: per-head loops
over frame slices of the token-level tensors.
"""

from __future__ import annotations

import argparse
import logging
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from sinkscope.cli import main as cli_main
from sinkscope.figures.registry import LAYER_FIGURES
from sinkscope.figures.render import draw, save_figure
from sinkscope.legacy import (
    LegacyCacheError,
    import_cache,
    import_to_parquet,
    peek_layers,
)
from sinkscope.legacy import tokens as legacy
from sinkscope.tables import FRAME_ATTENTION_SCHEMA, read_metadata

FSL = 6  # tokens per frame: small, so a frame slice is a handful of tokens
HEADS = 12


def random_logits(query_frames: int, key_frames: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    offset = torch.randn(key_frames, generator=g).repeat_interleave(FSL)  # frame-level structure, like a sink
    return (torch.randn(1, HEADS, query_frames * FSL, key_frames * FSL, generator=g) * 2 + offset).to(dtype)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


# -- the notebooks' computations, as they wrote them --------------------------------------


def notebook_frame_matrix(attn_matrix: np.ndarray, frame_seq_length: int) -> np.ndarray:
    """seed 001/003 plot_attention_heatmap: mean over each (query frame, key frame) slice of one head."""
    lq, lk = attn_matrix.shape
    num_q_frames, num_k_frames = lq // frame_seq_length, lk // frame_seq_length
    frame_attn = np.zeros((num_q_frames, num_k_frames))
    for qi in range(num_q_frames):
        for ki in range(num_k_frames):
            q_start, q_end = qi * frame_seq_length, min((qi + 1) * frame_seq_length, lq)
            k_start, k_end = ki * frame_seq_length, min((ki + 1) * frame_seq_length, lk)
            frame_attn[qi, ki] = attn_matrix[q_start:q_end, k_start:k_end].mean()
    return frame_attn


def notebook_curve(attn_data: dict, frame_seq_length: int) -> np.ndarray:
    """seed 000 compute_frame_attention: query-averaged, then key-frame-averaged logits [heads, key frames]."""
    attn = attn_data["attn_logits"][0].float().numpy()
    num_heads, _, lk = attn.shape
    num_key_frames = lk // frame_seq_length
    frame_attention = np.zeros((num_heads, num_key_frames))
    for h in range(num_heads):
        avg_per_key = attn[h].mean(axis=0)
        for kf in range(num_key_frames):
            frame_attention[h, kf] = avg_per_key[kf * frame_seq_length : (kf + 1) * frame_seq_length].mean()
    return frame_attention


def notebook_mass(probabilities: np.ndarray, frame_seq_length: int) -> np.ndarray:
    """seed 002 compute_frame_attention_distribution, per query frame: query-averaged
    probabilities summed over each key frame's tokens. One head: [query frames, key frames]."""
    lq, lk = probabilities.shape
    out = np.zeros((lq // frame_seq_length, lk // frame_seq_length))
    for qi in range(out.shape[0]):
        avg_attn_per_key_token = probabilities[qi * frame_seq_length : (qi + 1) * frame_seq_length].mean(axis=0)
        for kf in range(out.shape[1]):
            out[qi, kf] = avg_attn_per_key_token[kf * frame_seq_length : (kf + 1) * frame_seq_length].sum()
    return out


def cells(frame: pd.DataFrame, layer: int, metric: str) -> dict[tuple[int, int, int], float]:
    rows = frame[frame["layer"] == layer]
    return {
        (int(h), int(q), int(k)): float(v)
        for h, q, k, v in zip(rows["head"], rows["query_frame"], rows["key_frame"], rows[metric])
    }


# -- caches in the three layouts -----------------------------------------------------------


def token_level_cache(layers=(0, 4), num_frames: int = 9) -> dict:
    """run_extraction_figure4.py: the last block's 3 query frames against every frame."""
    entries = [
        {
            "layer_idx": layer,
            "attn_logits": random_logits(3, num_frames, seed=layer),
            "is_logits": True,
            "num_frames": num_frames,
            "frame_seq_length": FSL,
            "num_heads": HEADS,
            "num_query_frames": 3,
            "num_key_frames": num_frames,
        }
        for layer in layers
    ]
    return {
        "attention_weights": entries,
        "prompt": "A majestic eagle",
        "num_frames": num_frames,
        "frame_seq_length": FSL,
        "query_frames": list(range(num_frames - 3, num_frames)),
        "key_frames": list(range(num_frames)),
    }


def frame_matrix_cache(block_sizes=(1, 3, 3), layer: int = 4) -> tuple[dict, dict[int, np.ndarray]]:
    """run_extraction_each.py: the full frame x frame matrix, assembled block by block
    from token-level logits exactly as seed 004 does (zeros where a query cannot see)."""
    frames = sum(block_sizes)
    full = torch.zeros(HEADS, frames, frames)
    tokens = {}
    q_start = 0
    for block, size in enumerate(block_sizes):
        k_frames = sum(block_sizes[: block + 1])
        attn_logits = random_logits(size, k_frames, seed=100 + block, dtype=torch.float32)[0]
        tokens[block] = attn_logits.numpy()
        for h in range(HEADS):
            for qf_local in range(size):
                q_tokens = slice(qf_local * FSL, (qf_local + 1) * FSL)
                for kf in range(k_frames):
                    k_tokens = slice(kf * FSL, (kf + 1) * FSL)
                    full[h, q_start + qf_local, kf] = attn_logits[h, q_tokens, k_tokens].mean()
        q_start += size
    last = list(range(frames - block_sizes[-1], frames))
    data = {
        "layer_index": layer,
        "full_frame_attention": full,
        "last_block_frame_attention": full[:, last].mean(dim=1),
        "is_logits": True,
        "prompt": "A majestic eagle",
        "num_frames": frames,
        "frame_seq_length": FSL,
        "num_heads": HEADS,
        "block_sizes": list(block_sizes),
        "last_block_query_frames": last,
    }
    return data, tokens


@pytest.fixture
def token_cache(tmp_path):
    data = token_level_cache()
    path = tmp_path / "attention_cache_figure4.pt"
    torch.save(data, path)
    return path, data


@pytest.fixture
def matrix_cache(tmp_path):
    data, tokens = frame_matrix_cache()
    path = tmp_path / "layer4.pt"
    torch.save(data, path)
    return path, data, tokens


# -- layout 1: token-level tensors ---------------------------------------------------------


def test_token_level_logits_match_the_notebooks(token_cache):
    path, data = token_cache
    assert peek_layers(path) == [0, 4]
    frame, meta = import_cache(path, checkpoint="old")

    assert list(frame.columns) == FRAME_ATTENTION_SCHEMA.names
    assert len(frame) == 2 * HEADS * 3 * 9
    assert set(frame["checkpoint"]) == {"old"} and set(frame["prompt_id"]) == {"legacy"} and set(frame["seed"]) == {0}
    assert set(frame["pass"]) == {"denoise"} and set(frame["step"]) == {-1} and frame["timestep"].isna().all()
    assert set(frame["query_frame"]) == {6, 7, 8} and set(frame["block"]) == {2}  # 3 frames a block by default
    assert meta["legacy_layout"] == "token_level" and meta["prompt"] == "A majestic eagle" and meta["num_frames"] == 9
    assert meta["layers"] == [0, 4] and meta["skipped"] == [] and meta["frame_seq_length"] == FSL

    for entry in data["attention_weights"]:
        layer = entry["layer_idx"]
        attn = entry["attn_logits"][0].double().numpy()
        got_logit, got_mass = cells(frame, layer, "logit_mean"), cells(frame, layer, "prob_mass")
        for h in range(HEADS):
            expected = notebook_frame_matrix(attn[h], FSL)
            mass = notebook_mass(softmax(attn[h]), FSL)
            for qi, qf in enumerate(data["query_frames"]):
                for kf in data["key_frames"]:
                    assert got_logit[(h, qf, kf)] == pytest.approx(expected[qi, kf], rel=1e-5, abs=1e-6)
                    assert got_mass[(h, qf, kf)] == pytest.approx(mass[qi, kf], rel=1e-5, abs=1e-7)
        # Seed 000's Figure 4 curve is the query-frame average of logit_mean.
        curve = frame[frame["layer"] == layer].groupby(["head", "key_frame"])["logit_mean"].mean().unstack().to_numpy()
        np.testing.assert_allclose(curve, notebook_curve(entry, FSL), rtol=1e-5, atol=1e-6)
    sums = frame.groupby(["layer", "head", "query_frame"])["prob_mass"].sum()
    np.testing.assert_allclose(sums, 1.0, atol=1e-5)


def test_streaming_in_chunks_that_split_frames_gives_the_same_values(token_cache, monkeypatch):
    path, _ = token_cache
    whole, _ = import_cache(path, checkpoint="old")
    # 5 query rows a chunk: chunks straddle frames of 6 tokens; pages are released after each.
    monkeypatch.setattr(legacy, "CHUNK_ELEMENTS", 5 * 9 * FSL)
    chunked, _ = import_cache(path, checkpoint="old")
    monkeypatch.setattr(legacy, "_RELEASE_PAGES", False)
    unreleased, _ = import_cache(path, checkpoint="old")
    pd.testing.assert_frame_equal(chunked, unreleased)
    np.testing.assert_allclose(chunked["logit_mean"], whole["logit_mean"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(chunked["prob_mass"], whole["prob_mass"], rtol=1e-5, atol=1e-7)


def test_pages_of_a_mapped_cache_can_be_released(token_cache):
    from sinkscope.model.loading import torch_load

    path, _ = token_cache
    tensor = torch_load(path, allow_pickle=False)["attention_weights"][0]["attn_logits"]
    releaser = legacy._PageReleaser(tensor[0], path)
    assert releaser.enabled == (legacy.sys.platform.startswith("linux"))
    before = tensor.clone()
    releaser.release(tensor[0])
    assert torch.equal(tensor, before)  # re-read from the file, unchanged


def test_pre_zip_torch_save_format_loads_without_page_release(tmp_path):
    """torch.save(_use_new_zipfile_serialization=False) files cannot be mapped: they load
    into anonymous memory, whose pages must never be dropped."""
    from sinkscope.model.loading import torch_load

    data = token_level_cache(layers=(0,))
    old, new = tmp_path / "old_format.pt", tmp_path / "new_format.pt"
    torch.save(data, old, _use_new_zipfile_serialization=False)
    torch.save(data, new)
    pd.testing.assert_frame_equal(import_cache(old, checkpoint="x")[0], import_cache(new, checkpoint="x")[0])
    tensor = torch_load(old, allow_pickle=False)["attention_weights"][0]["attn_logits"]
    assert not legacy._PageReleaser(tensor[0], old).enabled


def test_probabilities_with_last_block_start_frame(tmp_path):
    """The Figure 4 script's attn_weights variant: softmax output, placed by last_block_start_frame."""
    logits = random_logits(3, 7, seed=7, dtype=torch.float32)
    probabilities = torch.softmax(logits, dim=-1)
    data = {
        "attention_weights": [
            {"layer_idx": 1, "attn_weights": probabilities, "last_block_start_frame": 4, "frame_seq_length": FSL}
        ],
        "block_sizes": [1, 3, 3],
        "prompt": "p",
    }
    path = tmp_path / "cache.pt"
    torch.save(data, path)
    frame, meta = import_cache(path, checkpoint="old", prompt_id="eagle", seed=3)
    assert set(frame["query_frame"]) == {4, 5, 6} and set(frame["block"]) == {2}
    assert set(frame["prompt_id"]) == {"eagle"} and set(frame["seed"]) == {3}
    assert frame["logit_mean"].isna().all()
    got = cells(frame, 1, "prob_mass")
    for h in range(HEADS):
        expected = notebook_mass(probabilities[0, h].double().numpy(), FSL)
        for qi, qf in enumerate((4, 5, 6)):
            for kf in range(7):
                assert got[(h, qf, kf)] == pytest.approx(expected[qi, kf], rel=1e-5, abs=1e-7)
    imported = meta["imported"][0]
    assert imported["values"] == "probabilities" and "summing to 1" in imported["decided_by"]
    assert any("logit_mean" in line and "log-sum-exp" in line for line in meta["not_imported"])


# -- layout 2: inference-mode call captures --------------------------------------------------


def inference_cache(layer: int = 3) -> tuple[dict, dict[int, list[np.ndarray]]]:
    """run_extraction.py: every attention call of the layer, in call order. 3 blocks of 3
    frames, 2 calls a block (denoising step, cache pass); plus calls it cannot place."""
    entries, calls = [], {}
    for block in range(3):
        for call in range(2):
            logits = random_logits(3, 3 * (block + 1), seed=10 * block + call, dtype=torch.float32)
            entries.append(
                {
                    "layer_idx": layer,
                    "attn_weights": logits,
                    "q_shape": torch.Size([1, 3 * FSL, HEADS, 8]),
                    "k_shape": torch.Size([1, logits.shape[-1], HEADS, 8]),
                }
            )
            calls.setdefault(block, []).append(logits[0].double().numpy())
        # Cross-attention to 512 text tokens, captured by the same hook.
        entries.append(
            {
                "layer_idx": layer,
                "attn_weights": torch.randn(1, HEADS, 3 * FSL, 512),
                "q_shape": torch.Size([1, 18, 12, 8]),
                "k_shape": torch.Size([1, 512, 12, 8]),
            }
        )
    # A partial sliding window: 4 frames and 2 tokens of keys.
    entries.append({"layer_idx": layer, "attn_weights": torch.randn(1, HEADS, 3 * FSL, 4 * FSL + 2)})
    # A layer whose only capture is cross-attention: nothing of it can be placed.
    entries.append({"layer_idx": 7, "attn_weights": torch.randn(1, HEADS, 3 * FSL, 512)})
    data = {
        "attention_weights": entries,
        "prompt": "A majestic eagle",
        "num_frames": 9,
        "frame_seq_length": FSL,
        "num_frame_per_block": 3,
        "layer_indices": [layer, 7],
        "config": {"denoising_step_list": [1000, 750]},
    }
    return data, calls


def test_inference_capture_places_what_it_can_and_lists_the_rest(tmp_path, caplog):
    data, calls = inference_cache()
    path = tmp_path / "attention_cache.pt"
    torch.save(data, path)
    assert peek_layers(path) == [3]
    with caplog.at_level(logging.WARNING, logger="sinkscope.legacy"):
        frame, meta = import_cache(path, checkpoint="old")

    assert meta["legacy_layout"] == "inference_capture"
    # Block b: queries 3b..3b+2 against keys 0..3b+2, the mean of its two calls.
    assert len(frame) == HEADS * 3 * (3 + 6 + 9)
    got_logit, got_mass = cells(frame, 3, "logit_mean"), cells(frame, 3, "prob_mass")
    for block, tensors in calls.items():
        assert set(frame.loc[frame["block"] == block, "query_frame"]) == {3 * block, 3 * block + 1, 3 * block + 2}
        for h in range(HEADS):
            logit = np.mean([notebook_frame_matrix(t[h], FSL) for t in tensors], axis=0)
            mass = np.mean([notebook_mass(softmax(t[h]), FSL) for t in tensors], axis=0)
            for qi in range(3):
                for kf in range(3 * (block + 1)):
                    key = (h, 3 * block + qi, kf)
                    assert got_logit[key] == pytest.approx(logit[qi, kf], rel=1e-5, abs=1e-6)
                    assert got_mass[key] == pytest.approx(mass[qi, kf], rel=1e-5, abs=1e-7)
    assert meta["averaged_calls"] == [
        {"layer": 3, "block": 0, "entries": [0, 1]},
        {"layer": 3, "block": 1, "entries": [3, 4]},
        {"layer": 3, "block": 2, "entries": [6, 7]},
    ]
    # What could not be placed is in the metadata and in a warning, entry by entry.
    skipped = {s["entry"]: s for s in meta["skipped"]}
    assert sorted(skipped) == [2, 5, 8, 9, 10]
    assert "partial sliding window" in skipped[9]["reason"] and "key length 26 " in skipped[9]["reason"]
    assert "cross-attention" in skipped[2]["reason"] and skipped[10]["layer"] == 7
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("attention_weights[9]" in m and "partial sliding window" in m for m in warned)
    assert meta["extra_fields"]["config"].startswith("dict")


def test_inference_capture_of_a_rolled_cache_keeps_only_the_blocks_it_can_place(tmp_path):
    # A 6-frame sliding window over 4 blocks: key lengths 3, 6, 6, 6 frames.
    entries = [
        {
            "layer_idx": 0,
            "attn_weights": random_logits(3, min(3 * (b + 1), 6), seed=b, dtype=torch.float32),
            "q_shape": (1, 18, 12, 8),
        }
        for b in range(4)
    ]
    path = tmp_path / "rolled.pt"
    torch.save({"attention_weights": entries, "frame_seq_length": FSL}, path)
    frame, meta = import_cache(path, checkpoint="old")
    assert sorted(set(frame["block"])) == [0, 1] and frame["key_frame"].max() == 5
    assert [s["entry"] for s in meta["skipped"]] == [2, 3]
    assert all("rolled" in s["reason"] for s in meta["skipped"])


# -- layout 3: frame matrices ---------------------------------------------------------------


def test_frame_matrix_rows_are_the_visible_cells(matrix_cache):
    path, _, tokens = matrix_cache
    assert peek_layers(path) == [4]
    frame, meta = import_cache(path, checkpoint="old")
    # Block-causal visibility of [1, 3, 3]: frame 0 sees 1 frame, 1-3 see 4, 4-6 see 7.
    assert len(frame) == HEADS * (1 * 1 + 3 * 4 + 3 * 7)
    block_end = {0: 1, 1: 4, 2: 4, 3: 4, 4: 7, 5: 7, 6: 7}
    assert (frame["key_frame"] < frame["query_frame"].map(block_end)).all()
    assert dict(zip(frame["query_frame"], frame["block"])) == {0: 0, 1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2}
    assert frame["prob_mass"].isna().all()
    assert meta["legacy_layout"] == "frame_matrix" and meta["block_sizes"] == [1, 3, 3]
    assert meta["imported"][0]["hidden_cells_per_head_dropped"] == 7 * 7 - 34
    # Against the token-level logits the matrix was built from, the notebooks' way.
    got = cells(frame, 4, "logit_mean")
    q_start = 0
    for block, size in enumerate((1, 3, 3)):
        for h in range(HEADS):
            expected = notebook_frame_matrix(tokens[block][h], FSL)
            for qi in range(size):
                for kf in range(expected.shape[1]):
                    assert got[(h, q_start + qi, kf)] == pytest.approx(expected[qi, kf], rel=1e-5, abs=1e-6)
        q_start += size


def test_frame_matrix_of_probabilities_and_hidden_nan(tmp_path):
    """Probabilities averaged over token pairs (the script's .mean()) are prob_mass / fsl;
    the cells a query cannot see may hold anything."""
    logits = random_logits(4, 4, seed=1, dtype=torch.float32)[0]  # 4 frames, one block each
    frames = torch.arange(4 * FSL) // FSL
    probabilities = torch.softmax(logits.masked_fill(frames[None, :] > frames[:, None], -math.inf), dim=-1)
    full = torch.stack(
        [torch.tensor(notebook_frame_matrix(probabilities[h].numpy(), FSL)) for h in range(HEADS)]
    ).float()
    full[:, 0, 3] = math.nan  # hidden: frame 0 cannot see frame 3
    path = tmp_path / "probs.pt"
    torch.save(
        {
            "layer_index": 2,
            "full_frame_attention": full,
            "is_logits": False,
            "block_sizes": [1, 1, 1, 1],
            "frame_seq_length": FSL,
        },
        path,
    )
    frame, meta = import_cache(path, checkpoint="old")
    assert len(frame) == HEADS * (1 + 2 + 3 + 4) and frame["logit_mean"].isna().all()
    np.testing.assert_allclose(frame.groupby(["head", "query_frame"])["prob_mass"].sum(), 1.0, atol=1e-5)
    assert meta["imported"][0]["probability_scale"] == FSL


# -- pickles and bad input ------------------------------------------------------------------


def test_objects_beyond_tensors_need_allow_pickle(tmp_path):
    data = token_level_cache(layers=(0,))
    data["args"] = argparse.Namespace(config_path="configs/self_forcing_dmd.yaml", seed=0)
    path = tmp_path / "pickled.pt"
    torch.save(data, path)
    for call in (
        lambda: peek_layers(path),
        lambda: import_to_parquet(path, tmp_path / "out.parquet", checkpoint="old"),
    ):
        with pytest.raises(ValueError) as error:
            call()
        message = str(error.value)
        assert (
            str(path) in message
            and "--allow-pickle" in message
            and "allow_pickle: true" in message
            and "legacy_caches" in message
        )
    assert not (tmp_path / "out.parquet").exists()
    assert peek_layers(path, allow_pickle=True) == [0]
    frame, meta = import_cache(path, checkpoint="old", allow_pickle=True)
    assert len(frame) == HEADS * 3 * 9 and "Namespace" in meta["extra_fields"]["args"] and meta["allow_pickle"]


def _with(data: dict, **changes) -> dict:
    return {**data, **changes}


def _entry(data: dict, drop: tuple[str, ...] = (), **changes) -> dict:
    entry = {key: value for key, value in data["attention_weights"][0].items() if key not in drop}
    return {**data, "attention_weights": [{**entry, **changes}]}


def _bad_caches():
    base = token_level_cache(layers=(0,))
    nan = random_logits(3, 9, seed=0)
    nan[0, 5, 7, 11] = math.nan
    no_layer = _entry(base, drop=("layer_idx",))
    matrix, _ = frame_matrix_cache()
    no_matrix_layer = dict(matrix)
    del no_matrix_layer["layer_index"]
    matrix_nan = matrix["full_frame_attention"].clone()
    matrix_nan[3, 5, 2] = math.nan
    return {
        "unknown layout": ({"weights": torch.zeros(3)}, "attention_weights"),
        "not a list": ({"attention_weights": torch.zeros(3)}, "field attention_weights"),
        "key length": (
            _entry(base, attn_logits=random_logits(3, 9, seed=0)[..., :-1]),
            "attention_weights[0].attn_logits: key length 53",
        ),
        "frame_seq_length": (_entry(base, frame_seq_length=7), "not a multiple of frame_seq_length 7"),
        "NaN": (_entry(base, attn_logits=nan), "field attention_weights[0].attn_logits: holds NaN"),
        "missing layer": (no_layer, "field attention_weights[0].layer_idx"),
        "query_frames": (_with(base, query_frames=[7, 8]), "field query_frames"),
        "is_logits": (
            _entry(base, drop=("attn_logits",), attn_weights=random_logits(3, 9, seed=0), is_logits=False),
            "is_logits",
        ),
        "matrix layer": (no_matrix_layer, "field layer_index"),
        "matrix NaN": (_with(matrix, full_frame_attention=matrix_nan), "field full_frame_attention: holds 1 NaN"),
        "block_sizes": (_with(matrix, block_sizes=[1, 3]), "field block_sizes"),
    }


@pytest.mark.parametrize("case", list(_bad_caches()))
def test_bad_input_names_the_file_and_the_field_and_writes_nothing(tmp_path, case):
    data, expected = _bad_caches()[case]
    path = tmp_path / "bad.pt"
    torch.save(data, path)
    out = tmp_path / "out" / "frame_attention.parquet"
    with pytest.raises(LegacyCacheError) as error:
        import_to_parquet(path, out, checkpoint="old")
    assert str(path) in str(error.value) and expected in str(error.value)
    assert not out.exists()


def test_peek_layers_reads_no_tensor_values(tmp_path):
    data = token_level_cache(layers=(2,))
    data["attention_weights"][0]["attn_logits"][0, 0, 0, 0] = math.nan
    path = tmp_path / "nan.pt"
    torch.save(data, path)
    assert peek_layers(path) == [2]  # the NaN is only found when the values are reduced
    with pytest.raises(LegacyCacheError):
        import_cache(path, checkpoint="old")


# -- CLI, figures and the workflow -------------------------------------------------------------


def test_cli_import_cache(token_cache, tmp_path, capsys):
    path, _ = token_cache
    out = tmp_path / "imported.parquet"
    assert (
        cli_main(
            [
                "import-cache",
                str(path),
                "--out",
                str(out),
                "--checkpoint",
                "sf_old",
                "--prompt-id",
                "eagle",
                "--seed",
                "5",
            ]
        )
        == 0
    )
    assert pq.read_schema(out).remove_metadata() == FRAME_ATTENTION_SCHEMA
    table = pd.read_parquet(out)
    assert set(table["checkpoint"]) == {"sf_old"} and set(table["prompt_id"]) == {"eagle"} and set(table["seed"]) == {5}
    meta = read_metadata(out)
    assert (
        meta["legacy_layout"] == "token_level"
        and meta["prompt"] == "A majestic eagle"
        and len(meta["legacy_file_sha256"]) == 64
    )

    bad = tmp_path / "bad.pt"
    torch.save({"something": 1}, bad)
    assert cli_main(["import-cache", str(bad), "--out", str(tmp_path / "bad.parquet")]) == 2
    assert "unknown layout" in capsys.readouterr().err and not (tmp_path / "bad.parquet").exists()

    pickled = tmp_path / "pickled.pt"
    torch.save({**token_level_cache(layers=(0,)), "args": argparse.Namespace(seed=0)}, pickled)
    assert cli_main(["import-cache", str(pickled), "--out", str(tmp_path / "p.parquet")]) == 2
    assert "--allow-pickle" in capsys.readouterr().err
    assert cli_main(["import-cache", str(pickled), "--out", str(tmp_path / "p.parquet"), "--allow-pickle"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["token_level", "frame_matrix"])
def test_figures_render_from_an_imported_cache_alone(token_cache, matrix_cache, tmp_path, layout):
    path = token_cache[0] if layout == "token_level" else matrix_cache[0]
    frame, meta = import_cache(path, checkpoint="old")
    options = {"step": "last", "metric": "logit_mean", "heads": ["L1H1", "L5H10"], "video_frames": False, "dpi": 80}
    frame_only = (
        "figure4",
        "figure4_steps",
        "layer_comparison",
        "first_middle_last",
        "sink_score_overview",
        "attention_over_time",
    )  # the source figures drawn from frame_attention alone
    kinds = [(kind, None) for kind in frame_only] + [
        (kind, layer) for kind in LAYER_FIGURES for layer in meta["layers"][-1:]
    ]
    for kind, layer in kinds:
        fig = draw(kind, frame, source="old", layer=layer, options=options)
        svg, png = tmp_path / f"{layout}_{kind}.svg", tmp_path / f"{layout}_{kind}.png"
        save_figure(fig, svg, png, dpi=80)
        text = svg.read_text()
        assert "<text" in text and png.stat().st_size > 1000
    assert "imported call" in (tmp_path / f"{layout}_figure4.svg").read_text()


@pytest.mark.workflow
def test_workflow_imports_a_legacy_cache(workflow):
    data = token_level_cache(layers=(0,), num_frames=6)
    torch.save(data, workflow.path("old_cache.pt"))
    workflow.write_config(
        {
            "prompts": {"eagle": "A majestic eagle soaring through a cloudy sky"},
            "seeds": [0],
            "layers": [0],
            "generation": {"num_frames": 6},
            "legacy_caches": {"sf_old": {"path": "old_cache.pt", "prompt_id": "eagle", "seed": 0}},
        }
    )
    workflow.run()
    table = pd.read_parquet(workflow.path("results/tables/frame_attention.parquet"))
    imported = table[table["checkpoint"] == "sf_old"]
    assert len(imported) == HEADS * 3 * 6 and set(imported["step"]) == {-1} and set(imported["prompt_id"]) == {"eagle"}
    assert set(table["checkpoint"]) == {"demo", "sf_old"}
    assert "<text" in workflow.path("results/figures/sf_old/figure4.svg").read_text()
    assert workflow.path("results/figures/sf_old/layer0/query_key_maps.png").exists()
    assert (
        read_metadata(workflow.path("results/imported/sf_old/frame_attention.parquet"))["legacy_layout"]
        == "token_level"
    )


def test_a_broadcast_tensor_that_claims_more_than_the_file_holds_is_refused(tmp_path):
    """A stride-0 view is saved with its one small storage: a few bytes claiming
    12 x 4680 x 4.6e6 values must fail at once, naming the field, not stream for minutes."""
    claimed = torch.zeros(1).expand(HEADS, 4680, 4_600_000)
    path = tmp_path / "broadcast.pt"
    torch.save(
        {
            "layer_index": 2,
            "full_frame_attention": claimed,
            "is_logits": True,
            "block_sizes": [1, 1],
            "frame_seq_length": FSL,
        },
        path,
    )
    assert path.stat().st_size < 10_000
    with pytest.raises(
        LegacyCacheError, match=r"broadcast.pt: field full_frame_attention: claims .* a broadcast \(stride-0\) view"
    ):
        import_cache(path, checkpoint="old")

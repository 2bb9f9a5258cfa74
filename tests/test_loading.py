"""Weight loading from real file layouts, and parity with diffusers' WanTransformer3DModel."""

from __future__ import annotations

import argparse

import pytest
import torch
from fakes import TINY, diffusers_model, tiny_state, write_self_forcing_pt, write_wan_folder
from safetensors.torch import save_file

from sinkscope.errors import ConfigError
from sinkscope.model import build_model
from sinkscope.model.checkpoints import CheckpointSpec, resolve_checkpoint
from sinkscope.model.loading import WeightsError, detect_format, load_checkpoint, load_transformer


def sample_inputs(batch=1, frames=3, height=4, width=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch, TINY.in_dim, frames, height, width, generator=g)
    timestep = torch.tensor([700.0, 250.0][:batch])
    context = torch.zeros(batch, TINY.text_len, TINY.text_dim)
    context[:, :5] = torch.randn(batch, 5, TINY.text_dim, generator=g)
    return latents, timestep, context


def outputs(model, **shape):
    with torch.no_grad():
        return model(*sample_inputs(**shape))


def spec(name="real", **entry):
    fields = dict(
        model=None, format="auto", weights=None, base=None, seed=0, ema=True, allow_pickle=False, dtype="float32"
    )
    fields.update(entry)
    return CheckpointSpec(name=name, **fields)


@pytest.fixture
def state():
    return tiny_state(seed=1)


@pytest.fixture
def reference(state):
    model = build_model(TINY, seed=None)
    model.load_state_dict(state)
    return outputs(model)


@pytest.mark.parametrize("shards", [1, 3])
def test_wan_release_folder(tmp_path, state, reference, shards):
    folder = write_wan_folder(tmp_path / "Wan2.1-T2V-1.3B", state, shards=shards)
    assert detect_format(folder) == "wan"
    model = load_transformer(folder)  # config from config.json; text_dim from the weights' header
    assert model.config.text_dim == TINY.text_dim and model.config.num_layers == 2
    torch.testing.assert_close(outputs(model), reference, rtol=0, atol=0)


def test_single_safetensors_file_with_comfyui_prefix(tmp_path, state, reference):
    path = tmp_path / "wan.safetensors"
    save_file({f"model.diffusion_model.{k}": v for k, v in state.items()}, str(path))
    assert detect_format(path) == "wan"
    torch.testing.assert_close(outputs(load_transformer(path, model=TINY)), reference, rtol=0, atol=0)


def test_self_forcing_checkpoint_ema_and_plain(tmp_path, state, reference):
    other = tiny_state(seed=2)
    path = write_self_forcing_pt(tmp_path / "checkpoints" / "self_forcing_dmd.pt", other, ema_state=state)
    assert detect_format(path) == "self_forcing"
    ema = load_transformer(path, model=TINY)  # generator_ema by default
    torch.testing.assert_close(outputs(ema), reference, rtol=0, atol=0)
    plain = load_transformer(path, model=TINY, ema=False)
    assert not torch.equal(outputs(plain), reference)
    only_plain = write_self_forcing_pt(tmp_path / "plain.pt", state)
    with pytest.raises(WeightsError, match="has no 'generator_ema'.*set ema: false"):
        load_transformer(only_plain, model=TINY)


def test_self_forcing_config_from_the_base_folder(tmp_path, state, reference):
    base = write_wan_folder(tmp_path / "wan_models" / "Wan2.1-T2V-1.3B", tiny_state(seed=9))
    path = write_self_forcing_pt(tmp_path / "sf.pt", tiny_state(seed=3), ema_state=state)
    entry = spec(weights=str(path), base=str(base))
    assert resolve_checkpoint(entry).model_config.text_dim == TINY.text_dim
    model = load_checkpoint(entry, device=torch.device("cpu"))
    torch.testing.assert_close(outputs(model), reference, rtol=0, atol=0)


def test_pickled_objects_need_allow_pickle(tmp_path, state, reference):
    path = write_self_forcing_pt(
        tmp_path / "sf.pt", state, ema_state=state, extra={"args": argparse.Namespace(lr=2e-6)}
    )
    with pytest.raises(WeightsError, match="refused by default.*allow_pickle: true"):
        load_transformer(path, model=TINY)
    model = load_transformer(path, model=TINY, allow_pickle=True)
    torch.testing.assert_close(outputs(model), reference, rtol=0, atol=0)


def test_strict_loading_names_missing_unexpected_and_mismatched(tmp_path, state):
    broken = dict(state)
    del broken["blocks.1.ffn.0.bias"]
    broken["blocks.1.extra.weight"] = torch.zeros(3)
    broken["head.head.weight"] = torch.zeros(5, TINY.dim)
    folder = write_wan_folder(tmp_path / "broken", broken)
    with pytest.raises(WeightsError) as error:
        load_transformer(folder)
    message = str(error.value)
    assert "1 missing (first: blocks.1.ffn.0.bias)" in message
    assert "1 unexpected (first: blocks.1.extra.weight)" in message
    assert "1 shape mismatches (first: head.head.weight (5, 48) vs model (16, 48))" in message
    assert str(folder) in message


def test_missing_files_fail_before_loading(tmp_path):
    with pytest.raises(ConfigError, match="checkpoints.real: weights 'nowhere.pt' do not exist"):
        resolve_checkpoint(spec(weights="nowhere.pt"), base_dir=tmp_path)
    (tmp_path / "sf.pt").write_bytes(b"PK\x03\x04")
    with pytest.raises(ConfigError, match="base folder 'gone' does not exist"):
        resolve_checkpoint(spec(weights="sf.pt", base="gone"), base_dir=tmp_path)
    with pytest.raises(ConfigError, match="set 'model'.*or 'base'"):
        resolve_checkpoint(spec(weights="sf.pt"), base_dir=tmp_path)
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(ConfigError, match="text.pt is not a torch .pt file"):
        resolve_checkpoint(spec(weights="text.pt", model="demo"), base_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .safetensors weights in folder"):
        load_transformer(tmp_path / "empty", model=TINY, format="wan")


def test_weights_digest_is_cached_and_content_based(tmp_path, state):
    folder = write_wan_folder(tmp_path / "w", state)
    entry = spec(weights=str(folder))
    cache = tmp_path / "cache.json"

    def weights_digest(entry, cache):
        return resolve_checkpoint(entry).digest(cache=cache)

    first = weights_digest(entry, cache=cache)
    assert weights_digest(entry, cache=cache) == first
    # Touched, same bytes: a new cache key, the same digest.
    weights = folder / "diffusion_pytorch_model.safetensors"
    weights.touch()
    assert weights_digest(entry, cache=cache) == first
    # New bytes: a new digest.
    write_wan_folder(folder, tiny_state(seed=5))
    assert weights_digest(entry, cache=cache) != first


# -- parity with an implementation nobody here wrote ------------------------------------


@pytest.mark.parametrize(
    "shape",
    [dict(batch=1, frames=3, height=4, width=6), dict(batch=2, frames=2, height=6, width=4, seed=1)],
)
def test_parity_with_diffusers_wan_transformer(tmp_path, shape):
    pytest.importorskip("diffusers")
    theirs = diffusers_model(seed=4)
    folder = tmp_path / "Wan2.1-T2V-1.3B-Diffusers"
    theirs.save_pretrained(folder / "transformer")
    assert detect_format(folder) == "diffusers"
    ours = load_transformer(folder)
    # diffusers' config has no text_len: Wan's 512 applies, and the pipeline pads the
    # text to 512 rows for both models.
    assert ours.config.text_len == 512
    latents, timestep, short = sample_inputs(**shape)
    context = torch.zeros(short.shape[0], 512, TINY.text_dim)
    context[:, : short.shape[1]] = short
    with torch.no_grad():
        expected = theirs(hidden_states=latents, timestep=timestep, encoder_hidden_states=context, return_dict=False)[0]
        got = ours(latents, timestep, context)
    assert got.shape == expected.shape == latents.shape
    relative = (got - expected).norm() / expected.norm()
    assert relative < 1e-4, relative
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)

    # The same weights in the original Wan names and as a Self-Forcing .pt give the same outputs.
    state = ours.state_dict()
    wan = load_transformer(write_wan_folder(tmp_path / "wan", state), model=ours.config)
    sf = load_transformer(write_self_forcing_pt(tmp_path / "sf.pt", state, ema_state=state), model=ours.config)
    for model in (wan, sf):
        with torch.no_grad():
            torch.testing.assert_close(model(latents, timestep, context), got, rtol=0, atol=0)


def test_parity_with_diffusers_holds_for_the_real_head_geometry():
    """head_dim 128 splits 44/42/42 as in Wan2.1-1.3B (two heads, one layer, tiny grid)."""
    pytest.importorskip("diffusers")
    from sinkscope.model import WanConfig

    config = WanConfig(
        dim=256, ffn_dim=64, num_heads=2, num_layers=1, in_dim=4, out_dim=4, text_dim=16, text_len=8, freq_dim=32
    )
    theirs = diffusers_model(config, seed=7)
    ours = build_model(config, seed=None)
    from sinkscope.model.formats import diffusers_to_wan_key
    from sinkscope.model.loading import check_state_dict

    state = {diffusers_to_wan_key(k): v for k, v in theirs.state_dict().items()}
    check_state_dict(ours, state, "diffusers state")
    ours.load_state_dict(state)
    g = torch.Generator().manual_seed(3)
    latents = torch.randn(1, 4, 5, 6, 8, generator=g)
    context = torch.randn(1, 8, 16, generator=g)
    with torch.no_grad():
        expected = theirs(
            hidden_states=latents, timestep=torch.tensor([500.0]), encoder_hidden_states=context, return_dict=False
        )[0]
        got = ours(latents, torch.tensor([500.0]), context)
    assert ((got - expected).norm() / expected.norm()) < 1e-4


@pytest.mark.workflow
def test_pipeline_on_real_formats_reruns_only_the_replaced_checkpoint(workflow, tmp_path):
    """Wan release folder + Self-Forcing .pt with umT5 prompts, through the real DAG."""
    from fakes import write_umt5

    release = write_wan_folder(workflow.path("wan_models/Wan2.1-T2V-1.3B"), tiny_state(seed=11))
    write_umt5(release, "wan")
    sf = write_self_forcing_pt(
        workflow.path("checkpoints/self_forcing_dmd.pt"), tiny_state(seed=12), ema_state=tiny_state(seed=13)
    )
    config = {
        "checkpoints": {
            "wan": {"weights": "wan_models/Wan2.1-T2V-1.3B"},
            "self_forcing": {"weights": "checkpoints/self_forcing_dmd.pt", "base": "wan_models/Wan2.1-T2V-1.3B"},
        },
        "prompts": {"eagle": "a majestic eagle soaring through cloudy sky"},
        "layers": [0, 1],
        "generation": {"num_frames": 6},
        "figures": {"heads": ["L1H1", "L2H4"]},
    }
    workflow.write_config(config)
    workflow.run()
    import pandas as pd

    from sinkscope.tables import read_metadata

    heads = pd.read_parquet(workflow.path("results/tables/head_stats.parquet"))
    assert set(heads["checkpoint"]) == {"wan", "self_forcing"}
    meta = read_metadata(workflow.path("results/extract/self_forcing/eagle/seed0/layers1/layer1.parquet"))
    assert meta["model_config"]["num_layers"] == 2 and meta["model_config"]["text_dim"] == 16
    assert meta["text_encoder"].startswith("umt5-Wan2.1-T2V-1.3B")
    assert len(meta["checkpoint_digest"]) == 64

    # Touching weights without changing them reruns nothing.
    (release / "diffusion_pytorch_model.safetensors").touch()
    (release / "models_t5_umt5-xxl-enc-bf16.pth").touch()
    sf.touch()
    assert {k: v for k, v in workflow.planned_jobs().items() if k != "all"} == {}
    # New bytes in one checkpoint rerun only that checkpoint's jobs.
    write_self_forcing_pt(sf, tiny_state(seed=12), ema_state=tiny_state(seed=14))
    jobs = {k: v for k, v in workflow.planned_jobs().items() if k != "all"}
    assert jobs["extract_attention"] == 2 and jobs["aggregate_source"] == 1
    assert jobs["layer_figures"] == 1  # the replaced checkpoint's layers only
    assert "encode_prompt" not in jobs


def test_corrupt_files_are_named(tmp_path):
    truncated = tmp_path / "truncated.pt"
    write_self_forcing_pt(tmp_path / "whole.pt", tiny_state())
    data = (tmp_path / "whole.pt").read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match="truncated.pt is not a readable torch file"):
        load_transformer(truncated, model=TINY)
    folder = tmp_path / "wan"
    folder.mkdir()
    (folder / "diffusion_pytorch_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(WeightsError, match="is not a .safetensors file"):
        load_transformer(folder, model=TINY)
    with pytest.raises(ValueError, match="dtype 'float8' is not one of auto"):
        load_transformer(tmp_path / "whole.pt", model=TINY, dtype="float8")


# -- the format registry: one object per format, for the check and for loading ----------------


def test_the_schemas_format_enum_is_the_registry():
    import yaml
    from conftest import REPO

    from sinkscope.model.formats import WEIGHT_FORMATS

    for schema in (REPO / "src" / "sinkscope" / "schemas" / "config.schema.yaml",):
        if schema.is_file():
            entry = yaml.safe_load(schema.read_text())["properties"]["checkpoints"]["additionalProperties"]
            described = entry["properties"]["format"]
            assert sorted(described["enum"]) == sorted(["auto", *WEIGHT_FORMATS]), schema
            # The description says what each is, in the words of its summary.
            assert all(f"{name} ({fmt.summary}" in described["description"] for name, fmt in WEIGHT_FORMATS.items()), (
                schema
            )


def test_a_format_registered_once_is_checked_and_loaded(tmp_path, monkeypatch, state, reference):
    """A new format is one class: the config check and loading both find it by name."""
    import numpy as np

    from sinkscope.model.config import parameter_shapes
    from sinkscope.model.formats import WEIGHT_FORMATS, WeightFormat, register
    from sinkscope.model.weightfiles import check_shapes

    monkeypatch.setattr("sinkscope.model.formats.WEIGHT_FORMATS", dict(WEIGHT_FORMATS))
    checked = []

    @register
    class NpzFormat(WeightFormat):
        name, summary = "npz", "numpy .npz of the state dict"

        def detect(self, path):
            return path.suffix == ".npz"

        def files(self, path):
            return [path]

        def check(self, path, config, options):
            checked.append(path)
            with np.load(path) as arrays:
                check_shapes({k: arrays[k].shape for k in arrays.files}, parameter_shapes(config), str(path))

        def read(self, path, config, options):
            with np.load(path) as arrays:
                return {k: torch.from_numpy(arrays[k].copy()) for k in arrays.files}

    write_wan_folder(tmp_path / "release", state)
    np.savez(tmp_path / "w.npz", **{k: v.numpy() for k, v in state.items()})
    resolved = resolve_checkpoint(spec(weights="w.npz", base="release"), base_dir=tmp_path)
    assert resolved.format == "npz" and checked == [tmp_path / "w.npz"]
    model = load_checkpoint(resolved, device=torch.device("cpu"))
    torch.testing.assert_close(outputs(model), reference, rtol=0, atol=0)
    np.savez(tmp_path / "short.npz", **{k: v.numpy() for k, v in list(state.items())[1:]})
    with pytest.raises(ConfigError, match="short.npz does not fit the model: 1 missing"):
        resolve_checkpoint(spec(weights="short.npz", base="release"), base_dir=tmp_path)


def test_the_demo_format_loads_the_seeded_model_bit_for_bit():
    resolved = resolve_checkpoint(spec(format="demo", model=TINY, seed=3))
    loaded = load_checkpoint(resolved, device=torch.device("cpu")).state_dict()
    built = build_model(TINY, seed=3).state_dict()
    assert loaded.keys() == built.keys()
    assert all(torch.equal(loaded[k], built[k]) and loaded[k].dtype == built[k].dtype for k in built)


def test_legacy_torch_files_are_read_by_the_check_and_damage_is_refused_there(tmp_path, state, reference):
    """torch's pre-1.6 format is walked without unpickling too: a whole file passes and loads,
    a pickle header over zeros or a cut-off file is refused by the config check, one line."""
    good = write_self_forcing_pt(tmp_path / "legacy.pt", tiny_state(seed=2), ema_state=state, legacy=True)
    assert not good.read_bytes().startswith(b"PK")
    model = load_checkpoint(
        resolve_checkpoint(
            spec(weights="legacy.pt", model=None, base=str(write_wan_folder(tmp_path / "release", state))),
            base_dir=tmp_path,
        ),
        device=torch.device("cpu"),
    )
    torch.testing.assert_close(outputs(model), reference, rtol=0, atol=0)
    raw = good.read_bytes()
    damaged = {"zeros.pt": b"\x80\x02" + bytes(4096), "cut.pt": raw[: len(raw) - 100], "half.pt": raw[: len(raw) // 2]}
    for name, data in damaged.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ConfigError, match="truncated or damaged|is truncated") as caught:
            resolve_checkpoint(spec(weights=name, base="release"), base_dir=tmp_path)
        message = str(caught.value)
        assert message.startswith("config key checkpoints.real: ") and name in message and "\n" not in message
    wrong = write_self_forcing_pt(tmp_path / "wrong.pt", {f"{k}x": v for k, v in state.items()}, legacy=True)
    with pytest.raises(ConfigError, match="wrong.pt has no 'generator_ema'"):
        resolve_checkpoint(spec(weights=wrong.name, base="release"), base_dir=tmp_path)


def test_a_misspelled_shipped_weights_name_lists_the_shipped_files(tmp_path):
    from sinkscope.model.weightfiles import PACKAGE_WEIGHTS

    shipped = sorted(f"sinkscope:{p.name}" for p in PACKAGE_WEIGHTS.glob("*.pt"))
    assert "sinkscope:demo_trained.pt" in shipped
    with pytest.raises(ConfigError) as caught:
        resolve_checkpoint(spec(weights="sinkscope:demo_traned.pt", model="demo"), base_dir=tmp_path)
    message = str(caught.value)
    assert "weights 'sinkscope:demo_traned.pt' do not exist" in message and "\n" not in message
    assert "did you mean 'sinkscope:demo_trained.pt'?" in message
    assert all(name in message for name in shipped)
    with pytest.raises(FileNotFoundError, match="the package ships sinkscope:"):
        load_transformer("sinkscope:nothing.pt", model="demo")

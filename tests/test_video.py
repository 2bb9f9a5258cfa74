"""Videos: the Wan VAE read from both layouts (a diffusers vae/ folder, the original .pth
the tests write key by key as Wan's module tree names them), chunked decoding against
diffusers' whole decode, encoding, MP4 files, the contact sheet, and the config check."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")
# The VAE module itself (diffusers imports it lazily): its import is paid once, here.
pytest.importorskip("diffusers.models.autoencoders.autoencoder_kl_wan")
av = pytest.importorskip("av")

from safetensors.torch import save_file  # noqa: E402

from sinkscope.errors import ConfigError, WeightsError  # noqa: E402
from sinkscope.model.checkpoints import CheckpointSpec, ResolvedCheckpoint, find_vae, vae_candidates  # noqa: E402
from sinkscope.model.config import get_model_config  # noqa: E402
from sinkscope.model.vae import (  # noqa: E402
    WAN22_LATENTS_MEAN,
    WAN22_LATENTS_STD,
    WanVAE,
    load_vae,
    original_config,
    original_state_dict,
)
from sinkscope.pipeline.latents import write_latents  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parent.parent

# Tiny VAEs of the two releases' layouts (Wan2.1: 4 levels, 2 residual blocks; Wan2.2:
# residual levels, 2x2 pixel patches, a wider decoder, z_dim 48).
TINY = {
    "wan2.1": {
        "base_dim": 8,
        "z_dim": 16,
        "dim_mult": [1, 2, 4, 4],
        "num_res_blocks": 2,
        "temperal_downsample": [False, True, True],
    },
    "wan2.2": {
        "base_dim": 8,
        "decoder_base_dim": 16,
        "z_dim": 48,
        "dim_mult": [1, 2, 4, 4],
        "num_res_blocks": 2,
        "temperal_downsample": [False, True, True],
        "is_residual": True,
        "in_channels": 12,
        "out_channels": 12,
        "patch_size": 2,
        "scale_factor_spatial": 16,
        "latents_mean": list(WAN22_LATENTS_MEAN),
        "latents_std": list(WAN22_LATENTS_STD),
    },
}


def tiny_module(kind: str):
    """A tiny AutoencoderKLWan with seeded weights (large enough that every layer matters)."""
    from diffusers import AutoencoderKLWan

    module = AutoencoderKLWan(**TINY[kind]).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in sorted(module.named_parameters()):
            scale, offset = (0.1, 1.0) if "gamma" in name else (0.3, 0.0)  # norms' gains about 1
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale + offset)
    return module


# -- Wan's original key names, from its module tree (wan/modules/vae.py and vae2_2.py) ----------

_RESIDUAL = {
    "norm1": "residual.0",
    "conv1": "residual.2",
    "norm2": "residual.3",
    "conv2": "residual.6",
    "conv_shortcut": "shortcut",
}


def _residual(rest: str) -> str:
    part, _, tail = rest.partition(".")
    return f"{_RESIDUAL[part]}.{tail}"


def wan_key(key: str, residual: bool, blocks: int) -> str:
    """A diffusers AutoencoderKLWan key as the original Wan VAE names it: its encoder and
    decoder are Sequentials of residual blocks and resamplers (Wan2.1: flat, the decoder's
    levels holding blocks + 1 residual blocks and an upsampler; Wan2.2: one Sequential a
    level), its middle a Sequential (block, attention, block), its head (norm, SiLU, conv)."""
    top = {"quant_conv": "conv1", "post_quant_conv": "conv2"}
    first, _, rest = key.partition(".")
    if first in top:
        return f"{top[first]}.{rest}"
    side, part, rest = key.split(".", 2)
    named = {"conv_in": "conv1", "norm_out": "head.0", "conv_out": "head.2"}
    if part in named:
        return f"{side}.{named[part]}.{rest}"
    if part == "mid_block":
        group, index, tail = rest.split(".", 2)
        position = {"resnets.0": 0, "attentions.0": 1, "resnets.1": 2}[f"{group}.{index}"]
        return f"{side}.middle.{position}.{tail if group == 'attentions' else _residual(tail)}"
    level, tail = rest.split(".", 1)
    level = int(level)
    if side == "encoder":
        if not residual:  # one flat Sequential in both layouts
            inner, _, leaf = tail.partition(".")
            return f"encoder.downsamples.{level}.{_residual(tail) if inner in _RESIDUAL else tail}"
        if tail.startswith("downsampler."):
            return f"encoder.downsamples.{level}.downsamples.{blocks}.{tail.removeprefix('downsampler.')}"
        _, j, leaf = tail.split(".", 2)
        return f"encoder.downsamples.{level}.downsamples.{j}.{_residual(leaf)}"
    if tail.startswith(("upsamplers.0.", "upsampler.")):
        leaf = tail.split(".", 2)[2] if tail.startswith("upsamplers.") else tail.split(".", 1)[1]
        index = blocks + 1
    else:
        _, j, leaf = tail.split(".", 2)
        index, leaf = int(j), _residual(leaf)
    if residual:
        return f"decoder.upsamples.{level}.upsamples.{index}.{leaf}"
    return f"decoder.upsamples.{level * (blocks + 2) + index}.{leaf}"


def original_layout(module, kind: str) -> dict:
    config = TINY[kind]
    return {
        wan_key(k, config.get("is_residual", False), config["num_res_blocks"]): v.clone()
        for k, v in module.state_dict().items()
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each tiny VAE in both layouts: a diffusers vae/ folder and the original .pth."""
    root = tmp_path_factory.mktemp("vae")
    out = {}
    for kind, name in (("wan2.1", "Wan2.1_VAE.pth"), ("wan2.2", "Wan2.2_VAE.pth")):
        module = tiny_module(kind)
        folder = root / kind / "vae"
        module.save_pretrained(folder)
        torch.save(original_layout(module, kind), root / kind / name)
        # The same keys in safetensors, half precision (as some repackaged copies are).
        half = root / kind / "vae.safetensors"
        save_file({k: v.half().contiguous() for k, v in original_layout(module, kind).items()}, half)
        out[kind] = {"module": module, "folder": folder, "pth": root / kind / name, "safetensors": half}
    return out


def test_original_keys_are_wans_module_tree():
    """The test's names are Wan's (spot checks against wan/modules/vae.py's tree and the
    key diffusers' single-file loader detects the Wan VAE by)."""
    keys = set(original_layout(tiny_module("wan2.1"), "wan2.1"))
    assert {
        "decoder.middle.0.residual.0.gamma",
        "encoder.downsamples.2.resample.1.weight",
        "encoder.downsamples.5.time_conv.weight",
        "decoder.upsamples.3.time_conv.weight",
        "decoder.upsamples.4.shortcut.weight",
        "decoder.upsamples.14.residual.6.bias",
        "conv1.weight",
        "decoder.head.2.weight",
    } <= keys
    keys22 = set(original_layout(tiny_module("wan2.2"), "wan2.2"))
    assert {
        "encoder.downsamples.0.downsamples.2.resample.1.weight",
        "encoder.downsamples.1.downsamples.2.time_conv.weight",
        "decoder.upsamples.0.upsamples.3.time_conv.weight",
        "decoder.upsamples.3.upsamples.2.residual.0.gamma",
    } <= keys22


@pytest.mark.parametrize("kind", ["wan2.1", "wan2.2"])
def test_both_layouts_load_to_the_same_module(written, kind):
    """The diffusers folder and the original .pth give diffusers' module with the same
    state dict (every tensor equal) and the same config, read from the .pth's shapes."""
    source = written[kind]["module"].state_dict()
    from_folder, from_pth = load_vae(written[kind]["folder"]), load_vae(written[kind]["pth"])
    for vae in (from_folder, from_pth):
        state = vae.module.state_dict()
        assert state.keys() == source.keys()
        assert all(torch.equal(state[k], source[k]) for k in source)
    keys = (
        "base_dim",
        "decoder_base_dim",
        "z_dim",
        "dim_mult",
        "num_res_blocks",
        "temperal_downsample",
        "is_residual",
        "in_channels",
        "out_channels",
        "patch_size",
        "scale_factor_spatial",
        "scale_factor_temporal",
        "latents_mean",
        "latents_std",
    )
    folder_config, pth_config = dict(from_folder.module.config), dict(from_pth.module.config)
    folder_config["decoder_base_dim"] = folder_config["decoder_base_dim"] or folder_config["base_dim"]
    assert {k: folder_config[k] for k in keys} == {k: pth_config[k] for k in keys}
    assert (from_pth.spatial_stride, from_pth.temporal_stride) == ((8, 4) if kind == "wan2.1" else (16, 4))
    half = load_vae(written[kind]["safetensors"]).module.state_dict()  # cast back to float32 as asked
    assert all(half[k].dtype == torch.float32 and torch.equal(half[k], source[k].half().float()) for k in source)


def test_conversion_agrees_with_diffusers_single_file_converter():
    """For Wan2.1's layout, diffusers' own converter (its single-file loader) renames every
    key as ours does."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    original = original_layout(tiny_module("wan2.1"), "wan2.1")
    ours = original_state_dict(original, original_config({k: tuple(v.shape) for k, v in original.items()}))
    theirs = convert_wan_vae_to_diffusers(original)
    assert ours.keys() == theirs.keys() and all(ours[k] is theirs[k] for k in ours)


def test_a_foreign_pth_is_refused_in_one_line(tmp_path):
    torch.save({"encoder.conv1.weight": torch.zeros(8, 3, 3, 3, 3)}, tmp_path / "Wan2.1_VAE.pth")
    with pytest.raises(WeightsError, match=r"not a Wan VAE state dict \(no 'conv2.weight'\)"):
        load_vae(tmp_path / "Wan2.1_VAE.pth")


@pytest.mark.parametrize("kind", ["wan2.1", "wan2.2"])
def test_chunked_decode_equals_one_whole_decode(written, kind):
    """Latent frame 0 alone, then 1, 2 or 3 latent frames a call: diffusers' whole decode
    (bit for bit at one a call, its own loop; to float rounding otherwise); a pixel stream fed
    the latents in pieces: to float rounding."""
    vae = load_vae(written[kind]["pth"])
    latents = torch.randn(1, vae.z_dim, 4, 2, 2, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = vae.module.decode(latents * vae.latents_std + vae.latents_mean).sample
    assert whole.shape == (1, 3, 13, 2 * vae.spatial_stride, 2 * vae.spatial_stride)
    assert torch.equal(vae.decode_pixels(latents, frames_per_call=1), whole)
    for per_call in (2, 3):
        torch.testing.assert_close(vae.decode_pixels(latents, frames_per_call=per_call), whole, rtol=0, atol=5e-5)
    stream = vae.pixel_stream()  # the latents in pieces of 1, 2 and 1, as Krea's re-encode pushes them
    pieces = [stream.push(latents[:, :, a:b]) for a, b in ((0, 1), (1, 3), (3, 4))]
    assert [piece.shape[2] for piece in pieces] == [1, 8, 4] and stream.latent_frames == 4
    # Within float rounding: the 1x1x1 post-quant convolution rounds a piece unlike the whole video.
    torch.testing.assert_close(torch.cat(pieces, dim=2), whole, rtol=0, atol=5e-5)
    frames = vae.decode(latents[0], frames_per_call=2)  # [C, F, H, W], as the extraction keeps them
    assert frames.dtype == torch.uint8 and frames.shape == (13, 2 * vae.spatial_stride, 2 * vae.spatial_stride, 3)
    expected = ((whole[0].permute(1, 2, 3, 0) + 1) * 127.5).round()
    assert (frames.float() - expected).abs().max() <= 1


def test_encode_is_diffusers_posterior_mean_normalized(written):
    """encode(frames) = (mean of diffusers' posterior - latents_mean) / latents_std, for uint8
    frames and for [-1, 1] video, in groups of 4 frames a call or 8."""
    vae = load_vae(written["wan2.1"]["pth"])
    frames = torch.randint(0, 256, (9, 16, 16, 3), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    video = frames.permute(3, 0, 1, 2)[None].float() / 127.5 - 1
    with torch.no_grad():
        mean = vae.module.encode(video).latent_dist.mode()
    expected = (mean - vae.latents_mean) / vae.latents_std
    latents = vae.encode(frames)
    assert latents.shape == (1, 16, 3, 2, 2) and torch.equal(latents, expected)
    torch.testing.assert_close(vae.encode(video, groups_per_call=2), expected, rtol=0, atol=1e-5)
    assert vae.encode(frames[:1]).shape == (1, 16, 1, 2, 2)  # Krea's re-encode: one frame, one latent
    with pytest.raises(ValueError, match="4 k \\+ 1"):
        vae.encode(frames[:4])


def test_memory_budget_sets_the_frames_a_call(written):
    """As many latent frames a call as the bound allows (at least 1, at most the frames after
    frame 0); the bound is measured units of the decoder's last level (docs/video.md)."""
    from sinkscope.model.vae import decode_bytes

    vae = load_vae(written["wan2.1"]["pth"])
    shape = (16, 21, 60, 104)
    unit = 4 * 8 * (60 * 8) * (104 * 8) * 4  # 4 video frames x the last level's 8 channels x 480x832, float32
    assert decode_bytes(vae.config, 60, 104, 3) == 13 * 4 * unit
    assert vae.frames_per_call(shape, 1) == 1 and vae.frames_per_call(shape, None) == 1
    assert vae.frames_per_call(shape, 13 * 4 * unit) == 3 and vae.frames_per_call(shape, 10**15) == 20
    wan22 = load_vae(written["wan2.2"]["pth"]).config  # 2x2 pixel patches: the last level works at half size
    assert decode_bytes(wan22, 44, 80) == 13 * 2 * 4 * 16 * (44 * 8) * (80 * 8) * 4


# -- MP4 files and the decode job --------------------------------------------------------------------


def test_mp4_round_trip(tmp_path):
    from sinkscope.pipeline.video import mp4_info, read_mp4, write_mp4

    yy, xx = np.mgrid[:48, :64]
    frames = np.stack([np.stack([(xx * 4 + t * 8) % 256, yy * 5, np.full_like(xx, 128)], -1) for t in range(9)])
    frames = frames.astype(np.uint8)
    write_mp4(frames, tmp_path / "run.mp4", fps=16)
    assert mp4_info(tmp_path / "run.mp4") == {"frames": 9, "width": 64, "height": 48, "fps": 16.0}
    back = read_mp4(tmp_path / "run.mp4")
    assert back.shape == frames.shape and np.abs(back.astype(int) - frames).mean() < 6
    assert read_mp4(tmp_path / "run.mp4", every=4).shape[0] == 3  # frames 0, 4, 8
    with pytest.raises(ValueError, match="even width and height"):
        write_mp4(frames[:, :, :63], tmp_path / "odd.mp4", fps=16)


def test_decode_video_job_writes_the_runs_mp4(written, tmp_path):
    from sinkscope.pipeline.video import decode_video_job, mp4_info

    folder = tmp_path / "extract"
    folder.mkdir()
    write_latents(folder, np.random.default_rng(3).normal(size=(16, 3, 2, 2)).astype(np.float32))
    decode_video_job(extraction=folder, output=tmp_path / "run.mp4", vae=written["wan2.1"]["pth"], fps=16, device="cpu")
    assert mp4_info(tmp_path / "run.mp4") == {"frames": 9, "width": 16, "height": 16, "fps": 16.0}


# -- the contact sheet ---------------------------------------------------------------------------------


def _svg_texts(path: Path) -> list[str]:
    root = ET.fromstring(path.read_text())
    return [
        " ".join(t.strip() for t in e.itertext() if t.strip()) for e in root.iter("{http://www.w3.org/2000/svg}text")
    ]


def test_contact_sheet_from_latents(tmp_path):
    """Without a VAE: each latent frame in the checkpoint's fixed latent-to-RGB projection
    (the ``channels`` fallback: channels 0-2 with one mapping for every row, the default's
    range), the default on top."""
    from sinkscope.model.latent_preview import DEMO_FACTORS
    from sinkscope.pipeline.contact_sheets import contact_sheet_job, frames_table, latent_images

    rng = np.random.default_rng(4)
    base = rng.normal(size=(16, 5, 8, 12)).astype(np.float32)
    folders = {}
    for variant, latents in (("no_sink", base * 2), ("default", base)):
        folders[variant] = tmp_path / variant
        folders[variant].mkdir()
        write_latents(folders[variant], latents)
    images = latent_images({"default": base, "no_sink": base * 2}, "channels", "default")
    assert len(images["default"]) == 5 and images["default"][0].shape == (8, 12, 3)
    low, high = np.percentile(base[0], 1), np.percentile(base[0], 99)
    assert images["default"][2][3, 4, 0] == np.clip(np.round((base[0, 2, 3, 4] - low) / (high - low) * 255), 0, 255)
    assert images["no_sink"][2][3, 4, 0] == np.clip(np.round((2 * base[0, 2, 3, 4] - low) / (high - low) * 255), 0, 255)
    fixed = latent_images({"default": base, "no_sink": base * 2}, "demo", "default")
    red = (base[:, 2, 3, 4] @ np.asarray(DEMO_FACTORS)[:, 0] + 1) / 2 * 255
    assert abs(int(fixed["default"][2][3, 4, 0]) - np.clip(np.round(red), 0, 255)) <= 1
    table = frames_table(folders, checkpoint="demo", prompt_id="eagle", seed=0, unit="latent", preview="demo")
    assert sorted(table["frame"].unique()) == [0, 1, 2, 3, 4] and set(table["unit"]) == {"latent"}
    assert set(table["preview"]) == {"demo"}
    with pytest.raises(ValueError, match="latent preview"):
        frames_table(folders, checkpoint="demo", prompt_id="eagle", seed=0, unit="latent")
    svg, png = tmp_path / "sheet.svg", tmp_path / "sheet.png"
    contact_sheet_job(
        inputs=list(folders.values()),
        variants=list(folders),
        checkpoint="demo",
        prompt_id="eagle",
        seed=0,
        unit="latent",
        svg=svg,
        png=png,
        options={"dpi": 40},
        preview="demo",
    )
    texts = _svg_texts(svg)
    assert png.read_bytes()[:8] == PNG_MAGIC and "latent frame" in texts
    labels = [t for t in texts if t in ("default", "no_sink")]
    assert labels == ["default", "no_sink"]  # the default on top, whatever the inputs' order
    assert any("in a fixed projection to RGB" in t for t in texts)


def test_contact_sheet_from_videos(tmp_path):
    """From MP4s: every 4th video frame, labelled by its video frame."""
    from sinkscope.pipeline.contact_sheets import contact_sheet_job
    from sinkscope.pipeline.video import write_mp4

    frames = np.zeros((13, 16, 32, 3), dtype=np.uint8) + np.arange(13, dtype=np.uint8)[:, None, None, None] * 15
    paths = []
    for variant in ("default", "kv_int8"):
        paths.append(tmp_path / f"{variant}.mp4")
        write_mp4(frames, paths[-1], fps=16)
    svg, png = tmp_path / "sheet.svg", tmp_path / "sheet.png"
    contact_sheet_job(
        inputs=paths,
        variants=["default", "kv_int8"],
        checkpoint="wan",
        prompt_id="city",
        seed=1,
        unit="video",
        svg=svg,
        png=png,
        options={"dpi": 40},
    )
    texts = _svg_texts(svg)
    assert "video frame" in texts and {"0", "4", "8", "12"} <= set(texts) and "1" not in texts
    assert any(re.search(r"Contact sheet: city, seed 1", t) for t in texts)


# -- where the VAE is, and the config check --------------------------------------------------------------


def _checkpoint(tmp_path: Path, model: str = "wan2.1-t2v-1.3b", weights: Path | None = None) -> ResolvedCheckpoint:
    return ResolvedCheckpoint(
        CheckpointSpec("wan", model=model), "wan", weights or tmp_path, None, get_model_config(model)
    )


def test_find_vae_in_a_release_folder(tmp_path):
    release = _checkpoint(tmp_path)
    assert find_vae(release) is None and vae_candidates(release) == [tmp_path / "Wan2.1_VAE.pth", tmp_path / "vae"]
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text('{"z_dim": 48}')  # another release's VAE
    assert find_vae(release) is None
    (tmp_path / "vae" / "config.json").write_text('{"_class_name": "AutoencoderKLWan", "z_dim": 16}')
    assert find_vae(release) == tmp_path / "vae"
    (tmp_path / "Wan2.1_VAE.pth").write_bytes(b"x")
    assert find_vae(release) == tmp_path / "Wan2.1_VAE.pth"
    # A diffusers pipeline's transformer/ folder: the VAE is its sibling.
    (tmp_path / "transformer").mkdir()
    assert tmp_path / "vae" in vae_candidates(_checkpoint(tmp_path, weights=tmp_path / "transformer"))


def test_check_refuses_video_without_a_vae_in_one_line():
    from sinkscope.pipeline.study import load_study

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    with pytest.raises(ConfigError) as error:
        load_study({**config, "outputs": {"video": True}}, ROOT, check_this_machine=False)
    assert "\n" not in str(error.value)
    assert re.search(r"outputs\.video: checkpoint 'demo' has no Wan VAE.*Wan2\.1_VAE\.pth", str(error.value))


def test_plan_of_videos_and_contact_sheets(monkeypatch, tmp_path):
    """outputs.contact_sheet alone: sheets from the extraction folders, no MP4; outputs.video
    (a checkpoint with a VAE): an MP4 a run, sheets from them, the VAE's digest a param."""
    from sinkscope.pipeline import videoplan
    from sinkscope.pipeline.study import load_study

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["variants"] = {"no_sink": {"interventions": [{"edit": "mask_keys", "heads": ["L1H1"], "key_frames": [0]}]}}
    study = load_study({**config, "outputs": {"contact_sheet": True}}, ROOT, check_this_machine=False)
    targets = videoplan.video_targets(study)
    prompt, seed = next(iter(study.prompts)), study.seeds[0]
    assert f"results/figures/demo/contact_sheet/{prompt}/seed{seed}.svg" in targets and not any(
        ".mp4" in t for t in targets
    )
    assert videoplan.sheet_inputs(study, "demo", prompt, seed)[0].startswith(
        f"results/extract/demo/{prompt}/seed{seed}/"
    )
    assert videoplan.sheet_params(study)["variants"] == ["default", "no_sink"]
    (tmp_path / "Wan2.1_VAE.pth").write_bytes(b"vae")
    monkeypatch.setattr(videoplan, "find_vae", lambda checkpoint: tmp_path / "Wan2.1_VAE.pth")
    study.config["outputs"]["video"] = True
    assert f"results/videos/demo@no_sink/{prompt}/seed{seed}.mp4" in videoplan.video_targets(study)
    assert videoplan.sheet_inputs(study, "demo", prompt, seed) == [
        f"results/videos/demo/{prompt}/seed{seed}.mp4",
        f"results/videos/demo@no_sink/{prompt}/seed{seed}.mp4",
    ]
    params = videoplan.video_params(study, "demo@no_sink")
    assert params["fps"] == 16 and params["vae"] == str(tmp_path / "Wan2.1_VAE.pth") and len(params["vae_sha256"]) == 64


def test_importing_sinkscope_needs_neither_diffusers_nor_av():
    import subprocess
    import sys

    code = (
        "import sys, sinkscope, sinkscope.model.vae, sinkscope.pipeline.video, sinkscope.pipeline.videoplan; "
        "print(any(m in sys.modules for m in ('diffusers', 'av', 'torch')))"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_decoded_video_is_what_the_module_gives(written):
    """Sanity: WanVAE wraps the given module (no copy), on its device and dtype."""
    vae = WanVAE(written["wan2.1"]["module"])
    assert vae.module is written["wan2.1"]["module"] and vae.dtype == torch.float32 and vae.z_dim == 16


@pytest.mark.slow
@pytest.mark.workflow
def test_workflow_decodes_videos_and_draws_their_contact_sheet(workflow):
    """The trained demo with a tiny Wan2.1 VAE in its release folder (base): an MP4 a run at
    16 fps, the contact sheet from them with the default above the variant, an unchanged
    rerun doing nothing; without the release folder, outputs.video is refused naming the
    checkpoint and the file."""
    release = workflow.path("release")
    release.mkdir()
    torch.save(original_layout(tiny_module("wan2.1"), "wan2.1"), release / "Wan2.1_VAE.pth")
    checkpoint = {"model": "demo", "format": "self_forcing", "weights": "sinkscope:demo_trained.pt", "base": "release"}
    config = {
        "checkpoints": {"demo": checkpoint},
        "layers": [0],
        "seeds": [0],
        "generation": {"num_frames": 9},
        "outputs": {"video": True},
        "variants": {"default": {}, "window": {"cache_policy": "window", "local_attn_frames": 6}},
    }
    workflow.write_config(config)
    workflow.run()
    from sinkscope.pipeline.video import mp4_info

    for source in ("demo", "demo@window"):  # the demo's 8x12 latents: 64x96 pixels; 9 latent frames: 33
        assert mp4_info(workflow.path(f"results/videos/{source}/drift/seed0.mp4")) == {
            "frames": 33,
            "width": 96,
            "height": 64,
            "fps": 16.0,
        }
    sheet = workflow.path("results/figures/demo/contact_sheet/drift/seed0.svg")
    texts = _svg_texts(sheet)
    assert [t for t in texts if t in ("default", "window")] == ["default", "window"] and "video frame" in texts
    assert {"0", "4", "32"} <= set(texts) and sheet.with_suffix(".png").read_bytes()[:8] == PNG_MAGIC
    assert without_all(workflow.planned_jobs()) == {}
    workflow.write_config({**config, "checkpoints": {"demo": {k: v for k, v in checkpoint.items() if k != "base"}}})
    result = workflow.run("--dry-run", check=False)
    assert result.returncode != 0
    assert re.search(r"outputs\.video: checkpoint 'demo' has no Wan VAE.*Wan2\.1_VAE\.pth", result.stderr)


def without_all(jobs: dict[str, int]) -> dict[str, int]:
    return {rule: n for rule, n in jobs.items() if rule != "all"}

"""Latents without a VAE as pictures (sinkscope.model.latent_preview): the fixed
latent-to-RGB projections against a per-pixel reference, the demo's projection derived as
documented, its balls visible and moving in the demo's own videos, frame 0 not tinted by
the image latent's offset; which checkpoint gets which projection; the contact sheet's
bilinear enlargement against a brute-force reference."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from conftest import REPO

from sinkscope.demo import data as synthetic
from sinkscope.figures.contact_sheet import enlarged
from sinkscope.model import latent_preview
from sinkscope.model.checkpoints import CheckpointSpec, ResolvedCheckpoint
from sinkscope.model.config import get_model_config
from sinkscope.model.latent_preview import (
    DEMO_FACTORS,
    DEMO_RANGE,
    PREVIEWS,
    demo_factors,
    preview_rgb,
)


def brute_force(latents: np.ndarray, factors, bias) -> np.ndarray:
    """The preview one pixel and one colour at a time, as ComfyUI's previewer writes it."""
    channels, frames, height, width = latents.shape
    out = np.zeros((frames, height, width, 3), dtype=np.uint8)
    for f in range(frames):
        for y in range(height):
            for x in range(width):
                for k in range(3):
                    value = sum(float(latents[c, f, y, x]) * factors[c][k] for c in range(channels)) + bias[k]
                    out[f, y, x, k] = int(np.clip(round((value + 1) / 2 * 255), 0, 255))
    return out


@pytest.mark.parametrize("name", list(PREVIEWS))
def test_each_projection_is_the_per_pixel_formula(name):
    factors, bias, _ = PREVIEWS[name]
    latents = np.random.default_rng(3).normal(scale=1.5, size=(len(factors), 2, 3, 4)).astype(np.float32)
    got = preview_rgb(latents, name)
    assert got.shape == (2, 3, 4, 3) and got.dtype == np.uint8
    assert np.abs(got.astype(int) - brute_force(latents, factors, bias)).max() <= 1  # float32 vs float64 rounding


def test_a_projection_refuses_latents_of_another_width():
    with pytest.raises(ValueError, match="'wan2.1' is for 16 channels, the latents have 48"):
        preview_rgb(np.zeros((48, 1, 2, 2), dtype=np.float32), "wan2.1")
    with pytest.raises(ValueError, match="no latent preview 'vae9'"):
        preview_rgb(np.zeros((16, 1, 2, 2), dtype=np.float32), "vae9")


def test_the_demo_projection_is_derived_as_documented():
    """Channels 0-2 without the image latent's offset direction, orthonormal, over DEMO_RANGE."""
    derived = demo_factors(synthetic.FIRST_FRAME_OFFSET)
    assert np.abs(np.asarray(DEMO_FACTORS) - derived).max() < 5.1e-5  # the table: 4 decimals
    rows = derived.T * DEMO_RANGE
    assert np.allclose(rows @ rows.T, np.eye(3), atol=1e-12)
    offset = np.asarray(synthetic.FIRST_FRAME_OFFSET)
    assert np.allclose(rows @ offset, 0, atol=1e-12)
    assert rows[0].argmax() == 0 and rows[1].argmax() == 1 and rows[2].argmax() == 2  # red, green, blue


def test_the_demo_frame_0_is_not_tinted_by_its_offset():
    """The image latent's fixed offset moves frame 0's mean colour by about 200 of 255 in
    channels 0-2 as they are; the demo projection leaves frame 0 near its video's colours."""
    videos = synthetic.synthetic_batch(3, 24, fine_texture=0.5).latents.numpy()

    def tint(video: np.ndarray, factors: np.ndarray) -> float:
        rgb = np.einsum("cfhw,ck->fhwk", video, factors) * 127.5
        return float(np.abs(rgb[0].mean((0, 1)) - rgb[1:].mean((0, 1, 2))).max())

    plain = np.zeros((16, 3))
    plain[[0, 1, 2], [0, 1, 2]] = 1 / DEMO_RANGE
    assert max(tint(v, np.asarray(DEMO_FACTORS)) for v in videos) < 40  # measured 30 at most
    assert np.median([tint(v, plain) for v in videos]) > 80  # measured 197


def ball_track(rgb: np.ndarray) -> np.ndarray:
    """Per frame, the x of the pixels whose colour stands out most from the frame's typical
    colour (the top tenth, weighted by how far): where a viewer sees the object."""
    xs = []
    for image in rgb.astype(np.float32):
        far = np.linalg.norm(image - np.median(image.reshape(-1, 3), axis=0), axis=-1)
        weight = np.where(far > np.percentile(far, 90), far, 0.0)
        xs.append(float((weight.sum(0) * np.arange(image.shape[1])).sum() / weight.sum()))
    return np.asarray(xs)


def test_the_demo_projection_shows_a_drifting_ball_moving_right():
    """In the demo's drift videos (data version 2, the shipped model's fine texture), the
    most distinct colour of each later frame moves left to right: its x follows the frame
    index (correlation over 0.8) in most videos; measured 85% of 40."""
    videos = synthetic.synthetic_batch(7, 40, classes="drift", fine_texture=0.5).latents.numpy()
    tracks = [ball_track(preview_rgb(video, "demo")[1:]) for video in videos]
    following = [np.corrcoef(np.arange(len(t)), t)[0, 1] > 0.8 for t in tracks]
    assert np.mean(following) >= 0.75, np.mean(following)
    assert np.median([t[-1] - t[0] for t in tracks]) > 4  # pixels of 12: across the frame


def _checkpoint(model: str) -> ResolvedCheckpoint:
    return ResolvedCheckpoint(CheckpointSpec("ck", model=model), "self_forcing", None, None, get_model_config(model))


def test_each_checkpoint_gets_the_projection_of_its_latent_space():
    from sinkscope.pipeline.study import load_study
    from sinkscope.pipeline.videoplan import latent_preview as preview_of
    from sinkscope.pipeline.videoplan import sheet_params

    assert preview_of(_checkpoint("demo")) == "demo"
    assert preview_of(_checkpoint("wan2.1-t2v-1.3b")) == preview_of(_checkpoint("wan2.1-t2v-14b")) == "wan2.1"
    assert preview_of(_checkpoint("wan2.2-ti2v-5b")) == "wan2.2"
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    study = load_study({**config, "outputs": {"contact_sheet": True}}, REPO, check_this_machine=False)
    assert sheet_params(study)["previews"] == {"demo": "demo"}


def test_enlarging_is_bilinear_between_pixel_centres():
    image = np.random.default_rng(5).integers(0, 256, size=(3, 4, 3)).astype(np.uint8)
    factor = 4
    got = enlarged(image, factor)
    expected = np.zeros((12, 16, 3))
    for i in range(12):
        for j in range(16):
            y = min(max((i + 0.5) / factor - 0.5, 0), 2)
            x = min(max((j + 0.5) / factor - 0.5, 0), 3)
            y0, x0 = int(np.floor(y)), int(np.floor(x))
            y1, x1 = min(y0 + 1, 2), min(x0 + 1, 3)
            fy, fx = y - y0, x - x0
            expected[i, j] = (
                image[y0, x0] * (1 - fy) * (1 - fx)
                + image[y0, x1] * (1 - fy) * fx
                + image[y1, x0] * fy * (1 - fx)
                + image[y1, x1] * fy * fx
            )
    assert np.abs(got.astype(int) - np.round(expected)).max() <= 1
    assert np.array_equal(enlarged(image, 1), image)


def test_the_caption_says_which_projection(tmp_path):
    """From latents, the sheet's caption names the projection and the enlargement."""
    import xml.etree.ElementTree as ET

    from sinkscope.pipeline.contact_sheets import contact_sheet_job
    from sinkscope.pipeline.latents import write_latents

    video = synthetic.synthetic_batch(1, 1, classes="drift", fine_texture=0.5).latents.numpy()[0]
    folders = []
    for variant, latents in (("default", video), ("edited", video * 1.5)):
        folders.append(tmp_path / variant)
        folders[-1].mkdir()
        write_latents(folders[-1], latents)
    svg = tmp_path / "sheet.svg"
    contact_sheet_job(
        inputs=folders,
        variants=["default", "edited"],
        checkpoint="demo",
        prompt_id="drift",
        seed=0,
        unit="latent",
        svg=svg,
        png=tmp_path / "sheet.png",
        options={"dpi": 40},
        preview="demo",
    )
    root = ET.fromstring(svg.read_text())
    caption = next(
        " ".join(t.strip() for t in e.itertext() if t.strip()) for e in root.iter() if e.get("id") == "page-caption"
    )
    assert "the demo's fixed projection: channels 0-2 as red, green and blue" in caption
    assert "enlarged 4x with bilinear interpolation" in caption and "percentile" not in caption
    assert latent_preview.PREVIEWS["demo"][2] in caption

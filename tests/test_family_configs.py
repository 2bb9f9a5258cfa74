"""The example configs of the Self-Forcing family (configs/*.yaml) pass the one check
(``load_study``) once their files lie where their comments say, here tiny stand-ins in the
real formats (a Wan release folder with umT5, Self-Forcing-layout .pt files, LongLive's
lora.pt); without them each fails naming every missing path, one line each."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO
from fakes import TINY, tiny_state, write_self_forcing_pt, write_umt5, write_wan_folder

from sinkscope.errors import ConfigError
from sinkscope.pipeline.config import apply_overrides, read_config_file
from sinkscope.pipeline.study import load_study

CONFIGS = {
    "self-forcing": {"self_forcing": "checkpoints/self_forcing_dmd.pt"},
    "causal-forcing-chunkwise": {"causal_forcing_chunkwise": "checkpoints/chunkwise/causal_forcing.pt"},
    "causal-forcing-framewise": {
        "causal_forcing_framewise": "checkpoints/framewise/causal_forcing.pt",
        "causal_forcing_pp_2step": "checkpoints/causal-forcing++/framewise-2step.pt",
        "causal_forcing_pp_1step": "checkpoints/causal-forcing++/framewise-1step.pt",
    },
    "family": {
        "self_forcing": "checkpoints/self_forcing_dmd.pt",
        "causal_forcing_chunkwise": "checkpoints/chunkwise/causal_forcing.pt",
        "causal_forcing_framewise": "checkpoints/framewise/causal_forcing.pt",
        "causal_forcing_pp_2step": "checkpoints/causal-forcing++/framewise-2step.pt",
        "causal_forcing_pp_1step": "checkpoints/causal-forcing++/framewise-1step.pt",
        "longlive": "longlive_models/models/longlive_base.pt",
    },
}
# What each checkpoint's own inference config asks for: (frames a block, steps, first block's
# steps or None, cache policy, window, sink, ema).
SETTINGS = {
    "self_forcing": (3, (1000, 750, 500, 250), None, "global", -1, 0, True),
    "causal_forcing_chunkwise": (3, (1000, 750, 500, 250), None, "global", -1, 0, False),
    "causal_forcing_framewise": (1, (1000, 750, 500, 250), None, "global", -1, 0, True),
    "causal_forcing_pp_2step": (1, (1000, 500), (1000, 750, 500, 250), "global", -1, 0, True),
    "causal_forcing_pp_1step": (1, (1000,), (1000, 750, 500, 250), "global", -1, 0, True),
    "longlive": (3, (1000, 750, 500, 250), None, "sink", 12, 3, False),
}
# Tiny stand-ins have 2 layers of 4 heads: the layers and heads are chosen to fit them.
TINY_FIT = {"layers": [0, 1], "figures.heads": ["L1H1", "L2H4"]}


def example(name: str) -> dict:
    return read_config_file(REPO / "configs" / f"{name}.yaml")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_without_its_files_each_missing_path_is_named_in_one_line(name, tmp_path):
    with pytest.raises(ConfigError) as error:
        load_study(example(name), base_dir=tmp_path, check_this_machine=False)
    lines = [line.strip() for line in str(error.value).removeprefix("invalid config:").strip().splitlines()]
    expected = []  # per checkpoint: its weights, the Wan release folder, LongLive's adapter
    for checkpoint, path in CONFIGS[name].items():
        expected.append(f"config key checkpoints.{checkpoint}: weights '{path}' do not exist")
        expected.append(f"config key checkpoints.{checkpoint}: base folder 'wan_models/Wan2.1-T2V-1.3B' does not exist")
        if checkpoint == "longlive":
            expected.append("config key checkpoints.longlive.lora: adapter 'longlive_models/models/lora.pt' does not")
    assert len(lines) == len(expected), lines
    for line, start in zip(lines, expected):
        assert line.startswith(start), line


def write_stand_ins(root, name: str) -> None:
    """Tiny files in the real formats, at the paths the example names."""
    release = write_wan_folder(root / "wan_models" / "Wan2.1-T2V-1.3B", tiny_state(seed=9))
    write_umt5(release, "wan")
    for seed, (_checkpoint, path) in enumerate(CONFIGS[name].items()):
        write_self_forcing_pt(root / path, tiny_state(seed=20 + seed), ema_state=tiny_state(seed=40 + seed))
    if "longlive" in CONFIGS[name]:
        module = "blocks.0.self_attn.q"
        lora = {
            f"base_model.model.{module}.lora_A.weight": torch.zeros(4, TINY.dim),
            f"base_model.model.{module}.lora_B.weight": torch.zeros(TINY.dim, 4),
        }
        torch.save({"generator_lora": lora}, root / "longlive_models" / "models" / "lora.pt")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_with_its_files_each_checkpoint_runs_its_own_inference_settings(name, tmp_path):
    write_stand_ins(tmp_path, name)
    study = load_study(apply_overrides(example(name), TINY_FIT), base_dir=tmp_path, check_this_machine=False)
    assert list(study.checkpoints) == list(CONFIGS[name])
    for checkpoint in study.checkpoints:
        options = study.options[checkpoint]
        block, steps, first, policy, window, sink, ema = SETTINGS[checkpoint]
        assert (options.frames_per_block, options.denoising_steps, options.first_block_denoising_steps) == (
            block,
            steps,
            first,
        )
        assert (options.cache_policy, options.local_attn_frames, options.sink_frames) == (policy, window, sink)
        assert (options.num_frames, options.timestep_shift, options.warp_denoising_step) == (21, 5.0, True)
        assert (options.context_noise, options.independent_first_frame) == (0.0, False)
        resolved = study.checkpoints[checkpoint]
        assert resolved.format == "self_forcing" and resolved.spec.ema is ema
        assert resolved.model_config.num_layers == TINY.num_layers  # read from the base folder's config.json
        params = study.extract_params(checkpoint, "0")
        assert params["generation"]["frames_per_block"] == block
    if name == "family":
        assert study.switches == {"story": [12]}
        assert study.checkpoints["longlive"].lora is not None
        assert "results/family/figures/longlive/prompt_switch.svg" in study.all_targets()
        calls = {c: study.options[c].calls([12]) for c in study.checkpoints}
        # 21 frame blocks: 5 calls for block 0, then 2 or 3 a block; one re-cache call.
        assert calls["causal_forcing_pp_1step"] == 5 + 20 * 2 + 1 and calls["self_forcing"] == 7 * 5 + 1

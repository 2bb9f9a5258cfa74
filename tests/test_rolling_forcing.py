"""Rolling Forcing's procedure (``generation.procedure: rolling_forcing``).

Its code cannot be run here (academic-only licence; no released weights on these
machines), so the references are the traces the fact sheet documents from it
(/work/shared/reference/cache-policies-as-coded.md section 3: the window schedule
3.2, the cache and attention 3.3 with its 5-step / 14-block trace), written out below by
hand; every captured call's statistics are checked against a float64 brute force over
exactly the keys and RoPE positions the call saw.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from conftest import REPO
from test_capture import FSL as DEMO_FSL
from test_capture import run as capture_run
from test_model import TINY, tiny_model
from test_policies import FSL, Probe
from test_stats import brute_force_statistics

from sinkscope.errors import ConfigError
from sinkscope.generation.common import FlowMatchSchedule
from sinkscope.generation.rolling import RollingSchedule, schedule_for
from sinkscope.generation.sampler import generate
from sinkscope.model import build_model
from sinkscope.model.policies import RollingForcingPolicy
from sinkscope.options import GenerationOptions, OptionsError
from sinkscope.pipeline.config import normalize_config
from sinkscope.stats.summaries import block_stats
from sinkscope.tokens import token_values

RF = {"procedure": "rolling_forcing"}


def rf_options(**kw) -> GenerationOptions:
    return GenerationOptions.from_config({**RF, **kw})


# -- the window schedule (fact sheet 3.2) -------------------------------------------------------


def test_schedule_matches_the_documented_trace():
    """5 steps, 14 blocks: windows 0..17; block b at level w - b; ramp-up takes the noisiest
    levels, the tail the cleanest (RF pipeline 174-196, 189-196, 224-231)."""
    schedule = RollingSchedule(14, 5, 3)
    trace = schedule.trace()
    assert len(trace) == 14 + 5 - 1
    assert trace[0] == [(0, 0)]
    assert trace[1] == [(0, 1), (1, 0)]
    assert trace[4] == [(0, 4), (1, 3), (2, 2), (3, 1), (4, 0)]
    assert trace[5] == [(1, 4), (2, 3), (3, 2), (4, 1), (5, 0)]
    assert trace[13] == [(9, 4), (10, 3), (11, 2), (12, 1), (13, 0)]
    assert trace[14] == [(10, 4), (11, 3), (12, 2), (13, 1)]
    assert trace[17] == [(13, 4)]
    # Every block meets every level once, in order; its final output comes from window b + W - 1.
    for block in range(14):
        seen = [(w, level) for w, window in enumerate(trace) for b, level in window if b == block]
        assert seen == [(block + i, i) for i in range(5)]
    assert [w.start_frame for w in schedule.windows][:7] == [0, 0, 0, 0, 0, 3, 6]
    assert schedule.windows[14].num_frames == 12
    assert schedule.model_calls() == 2 * 18 and schedule.table_calls() == 14 * 5 + 14 + 5 - 1
    # One full-window draw per block not at its last level.
    assert schedule.renoise_frames() == sum(
        w.num_frames * sum(lv < 4 for _, lv in t) for w, t in zip(schedule.windows, trace)
    )
    levels = FlowMatchSchedule(5.0).denoising_timesteps([1000, 800, 600, 400, 200], True)
    assert np.allclose(levels, [1000, 952.38, 882.35, 769.23, 555.56], atol=0.01)


def test_num_calls_and_model_calls():
    options = rf_options(num_frames=42, denoising_steps=[1000, 800, 600, 400, 200])
    assert options.cache_policy == "rolling_forcing" and (options.local_attn_frames, options.sink_frames) == (21, 3)
    assert options.num_calls == 14 * 5 + 14 + 5 - 1 == schedule_for(options).table_calls()
    assert schedule_for(options).model_calls() == 2 * (14 + 5 - 1)
    assert options.cache_capacity_frames == options.kv_cache_frames == 24
    assert options.largest_call_frames() == 15


# -- keys and positions of every call (fact sheet 3.3) ------------------------------------------


def rollout(num_blocks=14, steps=5, span=21, block=3, seed=0):
    """The real procedure on the tiny float64 model, every call recorded by the Probe (which
    asserts that the keys each softmax saw are the recorded raw keys roped at frame + shift)."""
    model = tiny_model()
    options = rf_options(
        num_frames=num_blocks * block,
        frames_per_block=block,
        sink_frames=block,
        local_attn_frames=span,
        denoising_steps=list(range(1000, 1000 - 200 * steps, -200)),
    )
    probe = Probe(model)
    policies = []
    original = RollingForcingPolicy.__init__

    def keep(self, *args, **kw):
        original(self, *args, **kw)
        policies.append(self)

    RollingForcingPolicy.__init__ = keep
    try:
        context = torch.randn(1, 5, TINY.text_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        result = generate(model, context, options=options, seed=seed)
    finally:
        RollingForcingPolicy.__init__ = original
    return result, probe, policies[0], model


def positions(layout):
    return [(f, f + s) for f, s in zip(layout.key_frames, layout.key_position_shift)]


def f(a, b, at=None):
    """Frames a..b at positions at..at+(b-a) (their own by default): the fact sheet's fa..b@p..q."""
    at = a if at is None else at
    return [(x, at + x - a) for x in range(a, b + 1)]


def expected_trace(num_blocks, steps, span, block):
    """Per model call (window, update, window, ...): (query frames, [(key frame, position)]),
    re-derived from the fact sheet's rules (3.3), independently of the policy code."""
    out, held = [], []
    for w in range(num_blocks + steps - 1):
        first, last = max(0, w - steps + 1), min(num_blocks - 1, w)
        start, frames = first * block, (last - first + 1) * block
        query = tuple(range(start, start + frames))
        if start + block > (held[-1] + 1 if held else 0):
            held += range(start, start + block)
            if len(held) > span + block:
                del held[block : 2 * block]  # FIFO behind the anchor
        if start == 0:
            keys = [(x, x) for x in query]
        else:
            before = [x for x in held[block:] if x < start]
            working = before[len(before) - max(0, min(len(before), span - frames - block)) :]
            anchor = start - len(working) - block
            keys = [(x, anchor + x) for x in held[:block]] + [(x, x) for x in working] + [(x, x) for x in query]
        out.append((query, keys))
        update = held[-span:]
        keys = [(x, x) for x in update]  # the anchor, when among them, at its own positions
        out.append((tuple(range(start, start + block)), keys))
    return out


def test_every_call_sees_the_documented_keys_at_the_documented_positions():
    result, probe, policy, _ = rollout()
    calls = [layers[0][0] for layers in probe.calls]
    assert len(calls) == 36 and probe.max_error < 1e-10
    # One layout serves every layer of a call.
    assert all(layout is layers[0][0] for layers in probe.calls for layout, _, _ in layers)
    got = [(layout.query_frames, positions(layout)) for layout in calls]
    assert got == expected_trace(14, 5, 21, 3)
    window, update = calls[0::2], calls[1::2]
    # The fact sheet's trace, literally.
    for w in range(5):
        assert positions(window[w]) == f(0, 3 * w + 2)  # windows 0-4: the window only
        assert positions(update[w]) == f(0, 2)  # slot 0 rewritten each time
    assert positions(window[5]) == f(0, 2) + f(3, 17)
    assert positions(update[5]) == f(0, 5)
    assert positions(window[6]) == f(0, 2) + f(3, 5) + f(6, 20)
    assert positions(update[6]) == f(0, 8)
    assert positions(window[7]) == f(0, 2, at=3) + f(6, 8) + f(9, 23)  # the anchor re-roped to cs - 6
    assert positions(window[10]) == f(0, 2, at=12) + f(15, 17) + f(18, 32)
    assert positions(update[10]) == f(0, 20)
    assert positions(update[11]) == f(3, 23)  # 21 frames, no anchor
    assert positions(update[12]) == f(6, 26)  # cache full: the oldest block after the anchor went
    assert positions(window[14]) == f(0, 2, at=21) + f(24, 29) + f(
        30, 41
    )  # the working cache grows as the window shrinks
    assert max(len(layout.key_frames) for layout in calls) <= 21
    assert len(result.calls) == 88 and result.latents.shape[2] == 42


def test_anchor_is_stored_unroped_and_fifo_keeps_it():
    _, probe, policy, model = rollout()
    tokens = 3 * FSL
    for layer in range(TINY.num_layers):
        # The anchor slot holds block 0's clean keys before RoPE (its last write: window 4's update).
        raw = torch.cat([probe.raw[layer][x] for x in range(3)], dim=1)
        torch.testing.assert_close(policy.cache.k[layer, :, :tokens], raw, rtol=0, atol=0)
    # 24 frames: the anchor and the 7 most recent blocks registered (the last window's first is block 13).
    assert policy.cache.frames(0) == [0, 1, 2, *range(21, 42)]
    assert policy.cache.capacity_frames == 24


def test_short_schedules_and_other_block_sizes():
    # 4 steps, blocks of 2, a span of 12: the working cache is 12 - 8 - 2 = 2 frames in full windows.
    _, probe, _, _ = rollout(num_blocks=9, steps=4, span=12, block=2)
    got = [(layers[0][0].query_frames, positions(layers[0][0])) for layers in probe.calls]
    assert got == expected_trace(9, 4, 12, 2)
    # As many blocks as steps: one full window, then the tail.
    _, probe, _, _ = rollout(num_blocks=3, steps=3, span=12, block=3)
    got = [(layers[0][0].query_frames, positions(layers[0][0])) for layers in probe.calls]
    assert got == expected_trace(3, 3, 12, 3)


# -- statistics: a float64 brute force of every captured call ----------------------------------


@pytest.mark.slow
def test_every_captured_call_equals_a_float64_brute_force():
    options = rf_options(num_frames=18, denoising_steps=[1000, 750, 500], local_attn_frames=12)
    tables, recorder, result = capture_run(options, token_profiles="all")
    frames, tokens, queries = tables[0]["frames"], tables[0]["tokens"], tables[0]["queries"]
    assert frames.groupby(["block", "pass", "step"], observed=True).ngroups == options.num_calls == len(result.calls)
    assert len(recorder.calls) == schedule_for(options).model_calls()
    checked = 0
    for info, q, k, layout in recorder.calls:
        for part in info.table_calls:
            lo = (part.start_frame - info.start_frame) * DEMO_FSL
            rows_q = q[:, lo : lo + part.num_frames * DEMO_FSL]
            ref = brute_force_statistics(
                rows_q, k, DEMO_FSL, part.num_frames, list(layout.key_lengths), q.shape[-1] ** -0.5
            )

            def call(t, part=part):
                return t[(t["block"] == part.block) & (t["pass"] == part.pass_) & (t["step"] == part.step)]

            got = call(frames).sort_values(["head", "query_frame", "key_frame"], kind="stable")
            assert sorted(set(got["query_frame"])) == list(range(part.start_frame, part.start_frame + part.num_frames))
            order = np.argsort(layout.key_frames, kind="stable")
            for name, atol in (("logit_mean", 1e-6), ("prob_mass", 1e-7), ("argmax_share", 1e-9)):
                assert np.allclose(
                    got[name].to_numpy(), ref[name][:, :, order].flatten().numpy(), atol=atol, rtol=1e-5
                ), (part, name)
            shifts = dict(zip(layout.key_frames, layout.key_position_shift))
            assert (got["key_position_shift"].to_numpy() == got["key_frame"].map(shifts).to_numpy()).all()
            assert (got["timestep"].to_numpy() == np.float32(part.timestep)).all()
            mine = call(queries).sort_values(["head", "query_frame"])
            assert np.allclose(mine["entropy_tokens"].to_numpy(), ref["entropy"].flatten().numpy(), atol=1e-6)
            # Token values are stored at float16 precision relative to their frame (docs/statistics.md).
            lists = token_values(call(tokens))[1].reshape(q.shape[0], len(layout.key_frames), DEMO_FSL)
            assert np.allclose(lists.reshape(q.shape[0], -1), ref["token_prob_mean"].numpy(), rtol=2**-10, atol=1e-9), (
                part
            )
            checked += 1
    assert checked == options.num_calls
    # Table calls: a window's blocks at their levels; updates at 1 + the level they re-encode.
    denoise = frames[frames["pass"] == "denoise"].groupby("block")["step"].unique()
    assert all(sorted(steps) == [0, 1, 2] for steps in denoise)
    cache = frames[frames["pass"] == "cache"].groupby("block")["step"].unique()
    assert sorted(cache[0]) == [1, 2, 3] and all(list(steps) == [3] for steps in cache[1:])
    # The anchor is re-roped in the window calls of later windows, as the rows show.
    shifted = frames[(frames["key_position_shift"] != 0)]
    assert set(shifted["key_frame"]) <= {0, 1, 2} and not shifted.empty


def test_block_stats_count_later_window_frames_as_other_mass():
    options = rf_options(num_frames=12, denoising_steps=[1000, 500], local_attn_frames=9)
    tables, _, _ = capture_run(options, layers=(0,))
    frame = tables[0]["frames"].assign(checkpoint="demo", variant="default", prompt_id="p", seed=0)
    stats = block_stats(frame, 3).set_index(["head", "block", "pass", "step"])
    # Block 0 at level 1 is denoised in window 1 jointly with block 1: frames 3..5 come after it.
    rows = frame[(frame["block"] == 0) & (frame["pass"] == "denoise") & (frame["step"] == 1) & (frame["head"] == 0)]
    later = rows.loc[rows["key_frame"] >= 3].groupby("query_frame")["prob_mass"].sum().mean()
    got = stats.loc[(0, 0, "denoise", 1)]
    assert got["self_mass"] == pytest.approx(1 - later) and got["other_mass"] == pytest.approx(later)
    assert got["sink_mass"] == 0  # block 0 is the sink: its own frames are self, not sink
    assert np.allclose(stats["sink_mass"] + stats["self_mass"] + stats["other_mass"], 1)


# -- memory and the demo model -----------------------------------------------------------------


def test_memory_stays_flat_over_a_long_rollout():
    model = build_model("demo", seed=0)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    results = {}
    seen = []
    original = RollingForcingPolicy.begin_call

    def watch(self, *args, **kw):
        original(self, *args, **kw)
        seen.append(self.cache.length(0) // self.frame_seq_length)

    RollingForcingPolicy.begin_call = watch
    try:
        for frames in (18, 60):
            options = rf_options(num_frames=frames, denoising_steps=[1000, 500], local_attn_frames=9)
            results[frames] = generate(model, context, options=options, seed=0)
    finally:
        RollingForcingPolicy.begin_call = original
    assert results[18].kv_cache_bytes == results[60].kv_cache_bytes
    per_frame = 2 * model.config.num_layers * DEMO_FSL * model.config.dim * 4
    assert results[60].kv_cache_bytes == options.kv_cache_frames * per_frame == 12 * per_frame
    assert max(seen) == 12 and seen[-1] == 12
    for result, frames in ((results[18], 18), (results[60], 60)):
        assert result.latents.shape[2] == frames and torch.isfinite(result.latents).all()
        assert (
            len(result.calls)
            == rf_options(num_frames=frames, denoising_steps=[1000, 500], local_attn_frames=9).num_calls
        )
        assert [c.is_last_block for c in result.calls] == [c.block == frames // 3 - 1 for c in result.calls]


def test_the_same_seed_gives_the_same_video_and_noise_is_drawn_as_planned():
    model = build_model("demo", seed=0)
    context = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(1))
    options = rf_options(num_frames=15, denoising_steps=[1000, 750, 500], local_attn_frames=12)
    a = generate(model, context, options=options, seed=3)
    b = generate(model, context, options=options, seed=3)
    c = generate(model, context, options=options, seed=4)
    assert torch.equal(a.latents, b.latents) and not torch.equal(a.latents, c.latents)


# -- refusals: one line, naming the key ------------------------------------------------------------


@pytest.mark.parametrize(
    "config, key",
    [
        (dict(procedure="rolling"), "generation.procedure: 'rolling' is not one of"),
        (dict(procedure="rolling_forcing", cache_policy="sink"), "generation.cache_policy: 'sink' cannot run under"),
        (dict(cache_policy="rolling_forcing"), "generation.procedure: 'self_forcing' cannot run cache_policy"),
        (dict(**RF, independent_first_frame=True, num_frames=22), "generation.independent_first_frame"),
        (dict(**RF, first_block_denoising_steps=[1000, 750, 500, 250, 100]), "generation.first_block_denoising_steps"),
        (dict(**RF, sink_frames=2), "generation.sink_frames: 2 must equal frames_per_block = 3"),
        (dict(**RF, num_frames=9), "generation.num_frames: 9 frames are 3 blocks, fewer than the 4 denoising steps"),
        (
            dict(**RF, local_attn_frames=12),
            "generation.local_attn_frames: 12 must be a multiple of frames_per_block = 3 and at least 15",
        ),
        (dict(**RF, local_attn_frames=16), "generation.local_attn_frames: 16 must be a multiple"),
    ],
)
def test_refusals_are_one_line_naming_the_key(config, key):
    with pytest.raises(OptionsError) as error:
        GenerationOptions.from_config({"num_frames": 21, **config})
    assert f"config key {key}" in str(error.value) and "\n" not in str(error.value)


def test_config_refuses_prompt_switches_and_names_the_variant():
    schedule = [{"text": "a", "start_frame": 0}, {"text": "b", "start_frame": 12}]
    for generation in ({**RF}, {**RF, "re_cache": False}):
        with pytest.raises(ConfigError) as error:
            normalize_config({"prompts": {"story": schedule}, "generation": {"num_frames": 21, **generation}})
        lines = str(error.value).removeprefix("invalid config:").strip().splitlines()
        assert len(lines) == 1 and lines[0].strip().startswith(
            "config key generation.procedure: 'rolling_forcing' generates"
        )
    with pytest.raises(ConfigError, match="config key variants.rf.procedure: 'rolling_forcing' generates"):
        normalize_config({"prompts": {"story": schedule}, "generation": {"num_frames": 21}, "variants": {"rf": RF}})
    with pytest.raises(ConfigError, match="config key generation.cache_policy: 'global' cannot run under"):
        normalize_config({"generation": {"num_frames": 21, "cache_policy": "global", **RF}})


def test_a_variant_naming_the_procedure_brings_its_cache():
    config = normalize_config(
        {"generation": {"num_frames": 21, "cache_policy": "sink"}, "variants": {"rf": RF, "base": {}}}
    )
    from sinkscope.pipeline.config import generation_options

    rf = generation_options(config, "rf", "demo")
    assert (rf.procedure, rf.cache_policy, rf.local_attn_frames, rf.sink_frames) == (
        "rolling_forcing",
        "rolling_forcing",
        21,
        3,
    )
    assert generation_options(config, "base", "demo").cache_policy == "sink"


def test_the_example_config_runs_rolling_forcing_once_its_files_exist(tmp_path):
    from fakes import tiny_state, write_self_forcing_pt, write_umt5, write_wan_folder

    from sinkscope.pipeline.config import apply_overrides, read_config_file
    from sinkscope.pipeline.study import load_study

    example = read_config_file(REPO / "configs" / "rolling-forcing.yaml")
    with pytest.raises(
        ConfigError, match="config key checkpoints.rolling_forcing: weights 'checkpoints/rolling_forcing_dmd.pt'"
    ):
        load_study(example, base_dir=tmp_path, check_this_machine=False)
    release = write_wan_folder(tmp_path / "wan_models" / "Wan2.1-T2V-1.3B", tiny_state(seed=9))
    write_umt5(release, "wan")
    write_self_forcing_pt(
        tmp_path / "checkpoints" / "rolling_forcing_dmd.pt", tiny_state(seed=20), ema_state=tiny_state(seed=40)
    )
    fit = {"layers": [0, 1], "figures.heads": ["L1H1", "L2H4"]}
    study = load_study(apply_overrides(example, fit), base_dir=tmp_path, check_this_machine=False)
    options = study.options["rolling_forcing"]
    assert (options.procedure, options.cache_policy, options.local_attn_frames, options.sink_frames) == (
        "rolling_forcing",
        "rolling_forcing",
        21,
        3,
    )
    assert options.denoising_steps == (1000, 800, 600, 400, 200) and options.num_frames == 126
    assert options.num_calls == 42 * 5 + 42 + 4
    assert study.extract_params("rolling_forcing", "0")["generation"]["procedure"] == "rolling_forcing"


# -- end to end: the command line on the demo model ------------------------------------------------


@pytest.mark.slow
def test_extract_and_aggregate_from_the_command_line(tmp_path):
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())

    def sinkscope(*args):
        return subprocess.run(
            [sys.executable, "-m", "sinkscope.cli", *args], capture_output=True, text=True, cwd=tmp_path, timeout=300
        )

    done = sinkscope(
        "extract",
        "--out",
        "ext",
        "--layers",
        "0",
        "--set",
        "generation.procedure=rolling_forcing",
        "--set",
        "generation.cache_policy=rolling_forcing",
        "--set",
        "generation.num_frames=15",
    )
    assert done.returncode == 0, done.stderr
    # A window call interleaves its blocks' records; each block is still one row group, in order.
    for name, expected in (
        ("layer0.parquet", range(5)),
        ("layer0.queries.parquet", range(5)),
        ("layer0.tokens.parquet", [4]),
    ):  # token profiles: the last block's calls
        groups = pq.ParquetFile(tmp_path / "ext" / name)
        blocks = [
            groups.read_row_group(i, columns=["block"]).column("block").unique().to_pylist()
            for i in range(groups.num_row_groups)
        ]
        assert blocks == [[b] for b in expected], (name, blocks)
    result = sinkscope("aggregate", "--input", "ext", "--out", "tables")
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(tmp_path / "tables" / "frame_attention.parquet")
    options = rf_options(num_frames=15)
    assert frame.groupby(["block", "pass", "step"], observed=True).ngroups == options.num_calls == 5 * 4 + 5 + 3
    stats = pd.read_parquet(tmp_path / "tables" / "block_stats.parquet")
    assert np.allclose(stats["sink_mass"] + stats["self_mass"] + stats["other_mass"], 1)
    refused = sinkscope("extract", "--out", "x", "--set", "generation.procedure=rolling_forcing")
    assert refused.returncode == 2 and "config key generation.cache_policy: 'global' cannot run under" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


# -- one entry per procedure ------------------------------------------------------------------


def test_every_procedure_spec_has_exactly_one_registered_declaration_and_back():
    from sinkscope.generation.procedures import PROCEDURES
    from sinkscope.generation.rolling import ROLLING_FORCING
    from sinkscope.generation.self_forcing import SELF_FORCING
    from sinkscope.options import PROCEDURE_TABLE

    assert sorted(PROCEDURES) == sorted(PROCEDURE_TABLE)
    assert len(set(map(id, PROCEDURES.values()))) == len(PROCEDURES)
    assert PROCEDURES["self_forcing"] is SELF_FORCING and PROCEDURES["rolling_forcing"] is ROLLING_FORCING
    assert all(procedure.name == name for name, procedure in PROCEDURES.items())


def test_generate_runs_the_procedure_registered_under_the_options_procedure(monkeypatch):
    from sinkscope.generation.procedures import PROCEDURES

    heard = []
    for name in ("self_forcing", "rolling_forcing"):
        monkeypatch.setitem(
            PROCEDURES, name, lambda model, context, **kw: heard.append(kw["options"].procedure) or kw["seed"]
        )
    for procedure, seed in (("self_forcing", 1), ("rolling_forcing", 2)):
        options = GenerationOptions.from_config({"procedure": procedure, "num_frames": 12})
        assert generate(None, torch.zeros(1, 2, 4), options=options, seed=seed) == seed
    assert heard == ["self_forcing", "rolling_forcing"]


def test_register_procedure_refuses_a_name_without_a_spec_and_a_second_declaration():
    from sinkscope.generation.loop import Procedure
    from sinkscope.generation.procedures import register_procedure
    from sinkscope.generation.steps import DMDSteps

    with pytest.raises(ValueError, match="no row in sinkscope.options.PROCEDURE_TABLE"):
        register_procedure(Procedure("no_such_procedure", DMDSteps))
    with pytest.raises(ValueError, match="registered already"):
        register_procedure(Procedure("rolling_forcing", DMDSteps))


def test_the_procedures_share_helpers_without_importing_each_other():
    from sinkscope.pipeline.codedigest import _imports

    assert "sinkscope.generation.rolling" not in _imports("sinkscope.generation.sampler", True)
    assert "sinkscope.generation.sampler" not in _imports("sinkscope.generation.rolling", True)

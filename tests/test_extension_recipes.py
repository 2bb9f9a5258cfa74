"""The recipes of docs/architecture.md "How to add", followed at test time, end to end.

Each toy is added exactly as its recipe says and removed again after: a cache policy with a
key of its own (its spec row and its module), a generation procedure that runs the existing
policies (its spec row and its module), a weight format and a figure kind. The modules of
the policy and the procedure are real files, found by the discovery of their package, and
the schema names them from their spec rows alone. Each goes through the config check
(``load_study`` on a config that names it), then through what it is for: a tiny CPU
generation, a weight load, a render. One test applies the policy's and the procedure's
recipes to a copy of the package, counts the files each touches, and runs the two there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
import torch
from conftest import REPO

import sinkscope.generation
import sinkscope.model.policies
import sinkscope.options
from sinkscope.discovery import import_submodules
from sinkscope.errors import ConfigError
from sinkscope.generation.common import FlowMatchSchedule
from sinkscope.generation.procedures import PROCEDURES, unregister_procedure
from sinkscope.generation.sampler import generate
from sinkscope.model import WanConfig, build_model
from sinkscope.model.policies import POLICY_CLASSES
from sinkscope.options import CACHE_POLICY_TABLE, PROCEDURE_TABLE, CallKind, GenerationOptions, procedures_running
from sinkscope.pipeline.study import load_study
from sinkscope.schema import load_schema

SMALL = WanConfig(
    dim=64, ffn_dim=64, num_heads=4, num_layers=2, text_dim=16, text_len=8, freq_dim=16, latent_height=4, latent_width=6
)
FSL = SMALL.frame_seq_length()

# -- the toys as their recipes write them: a row of a table in sinkscope/options.py, a module --------

TOY_POLICY_ROW = """
PolicySpec(
    "toy_flush",
    _defaults(6, 1),
    _WINDOW_AND_SINK,
    "a test's window that can empty itself",
    options=(OptionSpec("toy_flush", False, description="a block that overflows the window empties it."),),
    needs_sink=True,
)
"""

TOY_POLICY_MODULE = '''"""A test's window policy: FIFO after the sink; with ``toy_flush``, a block that overflows
the window empties it: every frame after the sink is evicted."""

from sinkscope.model.policies.base import WindowPolicy, register_policy


@register_policy
class ToyFlushPolicy(WindowPolicy):
    name = "toy_flush"
    settings_keys = ("window_frames", "sink_frames")

    def __init__(self, cache, *, window_frames, sink_frames, rope=None, toy_flush=False):
        self.toy_flush = toy_flush
        super().__init__(cache, window_frames=window_frames, sink_frames=sink_frames, rope=rope)

    def start_block(self, start, frames):
        held, kept = self._held(), self.protected_frames
        if self.toy_flush and held + frames > self.window_frames:
            self.cache.evict(held - kept, after=kept)
        super().start_block(start, frames)
'''

TOY_PROCEDURE_ROW = """
ProcedureSpec("toy_euler", "a test's sampler: Euler steps on the flow, then the cache pass")
"""

TOY_PROCEDURE_MODULE = '''"""A test's procedure: Euler's method on the shifted flow-matching schedule, x <- x +
(sigma' - sigma) v, the last step to sigma = 0, no noise drawn between steps; Self-Forcing's
prompt switch and cache pass."""

import torch

from sinkscope.generation.common import PASS_DENOISE, CallInfo, FlowMatchSchedule, latents_to_device
from sinkscope.generation.hooks import CachePass, PromptSwitch
from sinkscope.generation.loop import Procedure, Run, video_blocks
from sinkscope.generation.procedures import register_procedure


class EulerSteps:
    renoise_frames = 0

    def __init__(self, run: Run) -> None:
        options = run.options
        self.flow = FlowMatchSchedule(options.timestep_shift, options.num_train_timesteps)
        self.units = video_blocks(options)
        self.timesteps = self.flow.denoising_timesteps(options.denoising_steps, options.warp_denoising_step)

    def num_steps(self, block) -> int:
        return len(self.timesteps)

    def denoise(self, run: Run) -> list[torch.Tensor]:
        block = run.unit
        start, frames = block.start_frame, block.num_frames
        x = latents_to_device(run.noise.initial[start : start + frames], run.device, run.dtype)
        for step, t in enumerate(self.timesteps):
            run.announce(CallInfo(block.index, PASS_DENOISE, step, t, start, frames, block.last, run.segment))
            velocity = run.model(
                x,
                torch.full((1, frames), t, device=run.device),
                run.contexts[run.segment],
                cache_policy=run.policy,
                start_frame=start,
            )
            after = self.flow.sigma(self.timesteps[step + 1]) if step + 1 < len(self.timesteps) else 0.0
            x = x + (after - self.flow.sigma(t)) * velocity
        run.prediction = x
        return [x]


register_procedure(Procedure("toy_euler", EulerSteps, before_block=(PromptSwitch,), after_block=(CachePass,)))
'''


def spec_row(row: str):
    """The spec a row of sinkscope/options.py's tables declares, evaluated where it is written."""
    return eval(row, vars(sinkscope.options))  # the test's own text


@pytest.fixture
def add_module(monkeypatch, tmp_path):
    """``add(package, name, source)``: a module written as a file into a folder of ``package``
    (a temporary one beside its own), found by the package's discovery; forgotten after."""
    added = []

    def add(package: types.ModuleType, name: str, source: str) -> None:
        folder = tmp_path / package.__name__
        folder.mkdir()
        (folder / f"{name}.py").write_text(source)
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
        added.append((package, name))
        assert f"{package.__name__}.{name}" in import_submodules(package.__name__, package.__path__)

    yield add
    for package, name in added:
        sys.modules.pop(f"{package.__name__}.{name}", None)
        if hasattr(package, name):
            delattr(package, name)


def allow_in_schema(monkeypatch, node: dict, name: str) -> None:
    """The schema step of the weight format's recipe: ``name`` added to the enum of ``node`` (in memory)."""
    monkeypatch.setitem(node, "enum", [name, *node["enum"]])


def text() -> torch.Tensor:
    return torch.randn(1, 5, SMALL.text_dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


class Layouts:
    """Observer of layer 0: each call's key frames, by (block, pass, step)."""

    def __init__(self, model) -> None:
        self.info, self.keys = None, {}
        model.set_observer(0, self.observe)

    def begin_call(self, info) -> None:
        self.info = info

    def observe(self, q, k, v, layout, frame_bias=None):
        self.keys[(self.info.block, self.info.pass_, self.info.step)] = list(layout.key_frames)


# -- a cache policy: its spec row and its module ------------------------------------------------------


@pytest.fixture
def toy_policy(monkeypatch, add_module):
    monkeypatch.setitem(CACHE_POLICY_TABLE, "toy_flush", spec_row(TOY_POLICY_ROW))
    add_module(sinkscope.model.policies, "toy_flush", TOY_POLICY_MODULE)
    yield
    POLICY_CLASSES.pop("toy_flush")


def test_a_policy_is_its_spec_row_and_its_module(toy_policy):
    assert POLICY_CLASSES["toy_flush"].__module__ == "sinkscope.model.policies.toy_flush"
    # The schema names it, and declares its key with its type, from the spec row alone.
    generation = load_schema()["$defs"]["generation"]["properties"]
    assert generation["cache_policy"]["enum"][-2:] == ["toy_flush", None]
    assert "toy_flush (a test's window that can empty itself)" in generation["cache_policy"]["description"]
    assert generation["toy_flush"] == {
        "type": "boolean",
        "default": False,
        "description": "toy_flush: a block that overflows the window empties it.",
    }
    config = {"generation": {"cache_policy": "toy_flush", "num_frames": 12, "toy_flush": True}}
    options = load_study(config, check_this_machine=False).options["demo"]
    assert (options.cache_policy, options.local_attn_frames, options.sink_frames) == ("toy_flush", 6, 1)
    assert options.option("toy_flush") is True and options.to_dict()["toy_flush"] is True
    assert "toy_flush" not in GenerationOptions.from_config({"cache_policy": "toy_flush"}).to_dict()
    # Its own key is checked there and refused under any other policy, in one line naming it.
    with pytest.raises(ConfigError, match="generation.toy_flush: 'maybe' is not a boolean"):
        load_study({"generation": {"cache_policy": "toy_flush", "toy_flush": "maybe"}}, check_this_machine=False)
    with pytest.raises(ConfigError, match="generation.toy_flush: has no meaning for cache_policy 'window'"):
        load_study({"generation": {"cache_policy": "window", "toy_flush": True}}, check_this_machine=False)
    # Every procedure whose calls it takes runs it: Self-Forcing's blocks.
    assert procedures_running("toy_flush") == ("self_forcing",)

    # A tiny generation: block 2 (frames 6-8) overflows the window of 6: FIFO keeps the
    # sink and frames 4-5; the flush keeps the sink alone.
    model = build_model(SMALL, seed=3, dtype=torch.float64)
    seen = {}
    for flush in (False, True):
        layouts = Layouts(model)
        chosen = GenerationOptions.from_config({**config["generation"], "toy_flush": flush, "denoising_steps": [1000]})
        result = generate(model, text(), options=chosen, seed=0, observers=[layouts])
        assert len(result.calls) == chosen.num_calls and torch.isfinite(result.latents).all()
        seen[flush] = layouts.keys[(2, "denoise", 0)]
    assert seen == {False: [0, 4, 5, 6, 7, 8], True: [0, 6, 7, 8]}


def test_without_its_row_a_policy_is_an_unknown_name_in_one_line():
    with pytest.raises(ConfigError, match="config key generation.cache_policy: 'toy_flush' is not one of"):
        load_study({"generation": {"cache_policy": "toy_flush"}}, check_this_machine=False)
    with pytest.raises(ConfigError, match="unknown config key 'toy_flush' in generation"):
        load_study({"generation": {"toy_flush": True}}, check_this_machine=False)


# -- a generation procedure: its spec row and its module ----------------------------------------------


@pytest.fixture
def toy_procedure(monkeypatch, add_module):
    monkeypatch.setitem(PROCEDURE_TABLE, "toy_euler", spec_row(TOY_PROCEDURE_ROW))
    add_module(sinkscope.generation, "toy_euler", TOY_PROCEDURE_MODULE)
    yield
    unregister_procedure("toy_euler")


def test_a_procedure_is_its_spec_row_and_its_module_and_runs_every_policy_of_its_calls(toy_procedure):
    assert PROCEDURES["toy_euler"].steps.__module__ == "sinkscope.generation.toy_euler"
    assert load_schema()["$defs"]["generation"]["properties"]["procedure"]["enum"][-1] == "toy_euler"
    block_policies = [name for name in CACHE_POLICY_TABLE if "self_forcing" in procedures_running(name)]
    assert [name for name in CACHE_POLICY_TABLE if "toy_euler" in procedures_running(name)] == block_policies
    assert len(block_policies) == 9
    config = {"generation": {"procedure": "toy_euler", "cache_policy": "sink", "local_attn_frames": 6}}
    options = load_study(config, check_this_machine=False).options["demo"]
    assert (options.procedure, options.cache_policy, options.sink_frames) == ("toy_euler", "sink", 3)
    assert options.to_dict()["procedure"] == "toy_euler"
    with pytest.raises(ConfigError, match="'toy_euler' cannot run cache_policy 'rolling_forcing'"):
        load_study(
            {"generation": {"procedure": "toy_euler", "cache_policy": "rolling_forcing"}}, check_this_machine=False
        )
    assert CallKind.WINDOW not in PROCEDURE_TABLE["toy_euler"].calls

    # A tiny generation under an existing policy, with a prompt switch and its re-cache (the
    # hooks it shares with Self-Forcing): block 0 is Euler's method on the full forward of
    # its frames alone; the calls are what the spec counts, plus the re-cache.
    model = build_model(SMALL, seed=3, dtype=torch.float64)
    chosen = GenerationOptions.from_config(
        {"procedure": "toy_euler", "cache_policy": "window", "local_attn_frames": 6, "num_frames": 9}
    )
    other = torch.randn(1, 4, SMALL.text_dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    result = generate(model, [(0, text()), (6, other)], options=chosen, seed=0)
    assert len(result.calls) == chosen.calls([6]) == 3 * 5 + 1
    assert [c.pass_ for c in result.calls].count("recache") == 1
    flow = FlowMatchSchedule(chosen.timestep_shift)
    timesteps = flow.denoising_timesteps(chosen.denoising_steps, True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn((9, SMALL.in_dim, 4, 6), generator=g)[:3].permute(1, 0, 2, 3)[None].double()
    for step, t in enumerate(timesteps):
        velocity = model(x, torch.full((1, 3), t, dtype=torch.float64), text())
        after = flow.sigma(timesteps[step + 1]) if step + 1 < len(timesteps) else 0.0
        x = x + (after - flow.sigma(t)) * velocity
    torch.testing.assert_close(result.latents[:, :, :3], x, rtol=1e-10, atol=1e-10)


def test_a_hook_without_its_phase_is_refused_when_the_procedure_is_declared():
    from sinkscope.generation.hooks import CachePass
    from sinkscope.generation.loop import Procedure
    from sinkscope.generation.steps import DMDSteps

    with pytest.raises(ValueError, match="procedure 'toy': hook CachePass has no before_block method"):
        Procedure("toy", DMDSteps, before_block=(CachePass,))


def test_a_procedure_row_without_its_module_is_refused_in_one_line(monkeypatch):
    from sinkscope.generation.procedures import procedure_code

    monkeypatch.setitem(PROCEDURE_TABLE, "toy_euler", spec_row(TOY_PROCEDURE_ROW))
    with pytest.raises(ValueError, match="procedure 'toy_euler' has a row .* but no registered Procedure"):
        procedure_code("toy_euler")


def test_a_key_declared_twice_is_refused(monkeypatch):
    from dataclasses import replace

    from sinkscope.options import option_owners

    owner, name, option = option_owners()["kv_quant"]
    table = CACHE_POLICY_TABLE if owner == "cache_policy" else PROCEDURE_TABLE
    other = next(n for n in table if n != name)
    monkeypatch.setitem(table, other, replace(table[other], options=(*table[other].options, option)))
    with pytest.raises(ValueError, match="key 'kv_quant' is declared by"):
        option_owners()


# -- the two recipes on a copy of the package: the files each touches ---------------------------------


def file_digests(root) -> dict[str, str]:
    """Every file under ``root`` (compiled files aside) -> the sha256 of its bytes."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def touched(root, before: dict[str, str]) -> set[str]:
    """The files added, removed or changed under ``root`` since ``before``."""
    after = file_digests(root)
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


def add_row(options_file, table: str, row: str) -> None:
    """``row`` appended to ``table`` in sinkscope/options.py, as one writes it there."""
    source = options_file.read_text()
    end = re.compile(rf"^{table}: dict\[.*?^(    \)\n\}})", re.MULTILINE | re.DOTALL).search(source).start(1)
    options_file.write_text(source[:end] + textwrap.indent(row.strip() + ",\n", " " * 8) + source[end:])


# Run in the copy: the config check, then Snakemake's own check on the schema file as
# rules/common.smk runs it, then a tiny generation of the toy procedure under the toy policy.
RUN_IN_THE_COPY = """
import json, torch
from snakemake.utils import validate
from sinkscope.generation.sampler import generate
from sinkscope.model import build_model
from sinkscope.model.policies import POLICY_CLASSES
from sinkscope.pipeline.study import load_study
from sinkscope.schema import SCHEMA_PATH

generation = {"procedure": "toy_euler", "cache_policy": "toy_flush", "toy_flush": True, "denoising_steps": [1000, 500]}
study = load_study({"generation": {**generation, "num_frames": 9}}, check_this_machine=False)
validate(dict(study.config), schema=str(SCHEMA_PATH), set_default=False)
options = study.options["demo"]
result = generate(build_model("demo", seed=0), torch.randn(1, 3, 64), options=options, seed=0)
print(json.dumps({"policy": POLICY_CLASSES["toy_flush"].__module__, "options": options.to_dict(),
                  "calls": len(result.calls), "finite": bool(torch.isfinite(result.latents).all())}))
"""


def test_a_policy_and_a_procedure_each_touch_one_row_and_their_module(tmp_path):
    package = tmp_path / "src" / "sinkscope"
    shutil.copytree(REPO / "src" / "sinkscope", package, ignore=shutil.ignore_patterns("__pycache__"))
    before = file_digests(package)
    add_row(package / "options.py", "CACHE_POLICY_TABLE", TOY_POLICY_ROW)
    (package / "model" / "policies" / "toy_flush.py").write_text(TOY_POLICY_MODULE)
    assert touched(package, before) == {"options.py", "model/policies/toy_flush.py"}
    before = file_digests(package)
    add_row(package / "options.py", "PROCEDURE_TABLE", TOY_PROCEDURE_ROW)
    (package / "generation" / "toy_euler.py").write_text(TOY_PROCEDURE_MODULE)
    assert touched(package, before) == {"options.py", "generation/toy_euler.py"}

    env = dict(os.environ, PYTHONPATH=str(tmp_path / "src"), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", RUN_IN_THE_COPY], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["policy"] == "sinkscope.model.policies.toy_flush" and found["finite"]
    chosen = found["options"]
    assert (chosen["procedure"], chosen["cache_policy"], chosen["toy_flush"]) == ("toy_euler", "toy_flush", True)
    assert found["calls"] == 3 * (2 + 1)  # 3 blocks, each 2 Euler steps and the cache pass


# -- a weight format: one registered class, its name in the schema ----------------------------------


def test_a_weight_format_is_one_registered_class(tmp_path, monkeypatch):
    from sinkscope.model.config import parameter_shapes
    from sinkscope.model.formats import WEIGHT_FORMATS, WeightFormat, register
    from sinkscope.model.loading import load_checkpoint
    from sinkscope.model.weightfiles import check_shapes

    monkeypatch.setattr("sinkscope.model.formats.WEIGHT_FORMATS", dict(WEIGHT_FORMATS))
    checkpoint = load_schema()["properties"]["checkpoints"]["additionalProperties"]["properties"]
    allow_in_schema(monkeypatch, checkpoint["format"], "npz")

    @register
    class NpzFormat(WeightFormat):
        name, summary = "npz", "numpy .npz of the state dict"

        def detect(self, path):
            return path.suffix == ".npz"

        def files(self, path):
            return [path]

        def check(self, path, config, options):
            with np.load(path) as arrays:
                check_shapes({k: arrays[k].shape for k in arrays.files}, parameter_shapes(config), str(path))

        def read(self, path, config, options):
            with np.load(path) as arrays:
                return {k: torch.from_numpy(arrays[k].copy()) for k in arrays.files}

    state = build_model("demo", seed=4).state_dict()
    np.savez(tmp_path / "w.npz", **{k: v.numpy() for k, v in state.items()})
    config = {"checkpoints": {"toy": {"model": "demo", "format": "npz", "weights": "w.npz"}}}
    study = load_study(config, base_dir=tmp_path, check_this_machine=False)
    resolved = study.checkpoints["toy"]
    assert resolved.format == "npz"
    model = load_checkpoint(resolved, device=torch.device("cpu"))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    np.savez(tmp_path / "short.npz", **{k: v.numpy() for k, v in list(state.items())[1:]})
    with pytest.raises(ConfigError, match="short.npz does not fit the model: 1 missing"):
        load_study(
            {"checkpoints": {"toy": {**config["checkpoints"]["toy"], "weights": "short.npz"}}}, base_dir=tmp_path
        )


# -- a figure kind: its registry entry and its drawing module ----------------------------------------


def draw_toy_mass(tables, *, source, options, ax=None, **_):
    """The drawing module's ``draw``: each key frame's mean softmax mass, as bars."""
    from sinkscope.figures.layout import new_figure

    frame = tables["frame_attention"]
    means = frame.groupby("key_frame", observed=True)["prob_mass"].mean()
    fig = new_figure(4, 3)
    axes = fig.add_subplot()
    axes.bar(means.index.astype(int), means.to_numpy(), gid="toy-bars")
    axes.set_title(f"{source}: mean mass a key frame")
    return fig


@pytest.fixture
def toy_figure(monkeypatch):
    from sinkscope.figures.registry import FIGURES, SOURCE, FigureKind

    monkeypatch.setitem(
        FIGURES, "toy_mass", FigureKind("toy_mass", SOURCE, ("frame_attention",), (), "each key frame's mean mass")
    )
    module = types.ModuleType("sinkscope.figures.toy_mass")
    module.draw = draw_toy_mass
    monkeypatch.setitem(sys.modules, "sinkscope.figures.toy_mass", module)


def test_a_figure_kind_is_its_entry_and_its_module(toy_figure, tmp_path):
    from sinkscope.figures.render import draw
    from sinkscope.figures.style import save_figure
    from sinkscope.generation.capture import FrameStatsCapture
    from sinkscope.plot import plot

    model = build_model(SMALL, seed=3)
    with FrameStatsCapture(model, [1], frame_seq_length=FSL, token_profiles="none") as capture:
        generate(
            model,
            text().float(),
            options=GenerationOptions(num_frames=6, denoising_steps=[1000]),
            seed=0,
            observers=[capture],
        )
    rows = capture.to_frame()
    fig = draw("toy_mass", rows, source="demo", options={})
    save_figure(fig, tmp_path / "toy.svg", tmp_path / "toy.png")
    # The plotting API draws it by name too (plot_<kind> functions are made when it is imported).
    assert plot("toy_mass", rows.assign(checkpoint="demo", variant="default"), source="demo").axes
    assert 'id="toy-bars' in (tmp_path / "toy.svg").read_text() and (tmp_path / "toy.png").stat().st_size > 0

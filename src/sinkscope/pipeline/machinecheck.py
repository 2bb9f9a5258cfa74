"""What this machine can run and how big a job is: the jobs' device (its backend and
compile setting), every (checkpoint, variant) job against the memory it gets, and how
many layers and atlas runs one extraction job takes."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from sinkscope.errors import ConfigError
from sinkscope.model.checkpoints import ResolvedCheckpoint
from sinkscope.pipeline.config import generation_options, prompt_switches, variant_names


def check_machine(config: Mapping, resolved: Mapping[str, ResolvedCheckpoint], *, local: bool = True) -> str:
    """Check that this machine can run the study's extraction jobs; return the device.

    The device must exist (``device: cuda`` without a GPU fails here, not in a job), the
    capture's backend and compile setting must run on it, and every (checkpoint,
    variant) must fit its memory (``max_job_memory_gib``, or what the
    device has). For cluster executors (``local=False``) only an explicit
    ``max_job_memory_gib`` is checked: this machine is not where jobs run. Raises one
    ConfigError listing every problem.
    """
    from sinkscope.pipeline.resources import resolve_device

    device = resolve_device(config["device"], local=local)
    problems = device_problems(config, device, local=local) + _memory_problems(config, resolved, device, local=local)
    if problems:
        raise ConfigError.invalid(problems)
    return device


def device_problems(config: Mapping, device: str, *, local: bool = True) -> list[str]:
    """What of ``capture:`` cannot run on ``device`` (the jobs' device): Triton off CUDA or
    not installed, torch.compile asked for off CUDA (a job would skip it without a word),
    FlashAttention-4 pinned off CUDA or not installed."""
    problems = []
    capture = config["capture"]
    if capture["backend"] == "triton" and not device.startswith("cuda"):
        problems.append(
            f"config key capture.backend: 'triton' runs on CUDA only, and the jobs compute on {device!r}; use auto "
            "or torch"
        )
    elif capture["backend"] == "triton" and local and importlib.util.find_spec("triton") is None:
        problems.append("config key capture.backend: 'triton' is not installed here; use auto or torch")
    if capture["compile"] is True and not device.startswith("cuda"):
        problems.append(
            f"config key capture.compile: true compiles the model's blocks on CUDA only, and the jobs compute on "
            f"{device!r}, where they would run uncompiled; use auto or false"
        )
    if capture.get("attention_kernel") == "flash4":
        if not device.startswith("cuda"):
            problems.append(
                f"config key capture.attention_kernel: 'flash4' runs on CUDA only, and the jobs compute on "
                f"{device!r}; use auto or cudnn"
            )
        elif local and not _installed("flash_attn.cute"):
            problems.append(
                "config key capture.attention_kernel: 'flash4' needs flash-attn-4, not installed here "
                "(pip install 'sinkscope[flash4]'); use auto or cudnn"
            )
    return problems


def _installed(module: str) -> bool:
    """Whether ``module`` (dotted) can be found here (its parent packages are imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except Exception:  # noqa: BLE001 - a parent package missing or broken: not usable here
        return False


def _memory_problems(
    config: Mapping, resolved: Mapping[str, ResolvedCheckpoint], device: str, *, local: bool
) -> list[str]:
    """Every (checkpoint, variant) whose extraction job does not fit the memory it gets."""
    from sinkscope.pipeline.resources import (
        AUTO_MEMORY_SHARE,
        GIB,
        auto_layers_per_job,
        default_dtype,
        device_memory_bytes,
        estimate_job_memory,
    )

    limit_gib = config.get("max_job_memory_gib")
    limit = int(limit_gib * GIB) if limit_gib is not None else (device_memory_bytes(device) if local else None)
    if limit is None:
        return []
    where = f"max_job_memory_gib = {limit_gib}" if limit_gib is not None else f"the {device} here"
    problems = []
    captured = study_layers_per_job(config, resolved, device)
    switches = _switch_frames(config)
    for name, checkpoint in resolved.items():
        dtype = default_dtype(device, checkpoint.spec.dtype)
        for variant in variant_names(config):
            options = generation_options(config, variant, name)
            estimate = estimate_job_memory(
                checkpoint.model_config, options, dtype, captured_layers=captured, switch_frames=switches
            )
            if estimate.total > limit:
                fits = auto_layers_per_job(
                    checkpoint.model_config, options, dtype, layers=captured, memory_bytes=limit, switch_frames=switches
                )
                fewer = (
                    estimate_job_memory(
                        checkpoint.model_config, options, dtype, captured_layers=fits, switch_frames=switches
                    ).total
                    <= limit * AUTO_MEMORY_SHARE
                )
                problems.append(
                    f"checkpoint {name!r}{'' if variant == 'default' else f', variant {variant!r}'}: an extraction job "
                    f"needs about {estimate.total / GIB:.1f} GiB ({estimate.describe()} GiB) with {captured} "
                    f"layer{'s' if captured != 1 else ''} captured, more than {where} ({limit / GIB:.1f} GiB); "
                    + (f"set layers_per_job: {fits} (or max_job_memory_gib, which auto then fills), " if fewer else "")
                    + "lower generation.num_frames or latent_height/latent_width, use a bounded cache_policy, or set "
                    "max_job_memory_gib"
                )
    return problems


# runs_per_job: auto. A job's runs go through the model one after another, so its memory is
# its largest run's (which the check fits to the device), whatever their number: the bound
# is the job's length. 64 runs keep a job of the 1.3B's atlas near 3 min on an H100 (2.6 s a
# run eager, docs/performance.md), so loading and compiling (8-40 s) cost a few percent and
# an atlas of one seed still spreads over several GPUs; on the CPU, a process start (3-5 s
# with torch, more than the demo's generation) is paid once per 64 runs.
AUTO_RUNS_PER_JOB = 64


def resolve_runs_per_job(value: int | str) -> int:
    """How many runs of one checkpoint, prompt and seed one extraction job generates at most
    (``runs_per_job``): a number, or ``AUTO_RUNS_PER_JOB`` for ``auto``."""
    return AUTO_RUNS_PER_JOB if value == "auto" else max(1, int(value))


def resolve_layers_per_job(value: int | str, layers: int, device: str) -> int:
    """How many layers one extraction job captures, before memory is counted. ``auto``: every
    layer in one job on CUDA (one generation serves all: 27x less GPU time for 30 layers),
    one a job on the CPU (reruns stay per layer and cost little); a number, at most the
    study's layers."""
    if value == "auto":
        return max(1, layers) if device.startswith("cuda") else 1
    return max(1, min(int(value), layers))  # more than the study's layers: all of them in one job


def study_layers_per_job(config: Mapping, resolved: Mapping[str, ResolvedCheckpoint], device: str) -> int:
    """How many layers one extraction job of this study captures: ``resolve_layers_per_job``,
    except that ``auto`` on CUDA with ``max_job_memory_gib`` set captures the most layers
    that every (checkpoint, variant) job fits in ``AUTO_MEMORY_SHARE`` of it
    (``resources.auto_layers_per_job``). Only the config decides (not the GPU of the
    machine that reads it), so every process that builds the workflow, a cluster job's
    too, plans the same layer groups."""
    value, layers, limit_gib = config["layers_per_job"], len(config["layers"]), config.get("max_job_memory_gib")
    if value != "auto" or not device.startswith("cuda") or limit_gib is None or not resolved:
        return resolve_layers_per_job(value, layers, device)
    from sinkscope.pipeline.resources import GIB, auto_layers_per_job, default_dtype

    switches = _switch_frames(config)
    return min(
        auto_layers_per_job(
            checkpoint.model_config,
            generation_options(config, variant, name),
            default_dtype(device, checkpoint.spec.dtype),
            layers=layers,
            memory_bytes=int(limit_gib * GIB),
            switch_frames=switches,
        )
        for name, checkpoint in resolved.items()
        for variant in variant_names(config)
    )


def _switch_frames(config: Mapping) -> list[int]:
    """Every latent frame where some prompt of the study switches (the re-cache calls)."""
    return sorted({frame for frames in prompt_switches(config).values() for frame in frames})

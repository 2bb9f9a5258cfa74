"""What every pipeline job shares: its log, its error line, its device, its provenance.

The stage modules (``sinkscope.pipeline.extract``, ``sinkscope.pipeline.aggregate``, ``sinkscope.figures``,
``sinkscope.figures.report``, ``sinkscope.model.text``, ``sinkscope.legacy``) hold the job functions;
the Snakemake scripts call them through ``run_job``, which keeps the traceback in the
job's log and gives the console one line naming the file, key or value.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sinkscope import __version__
from sinkscope.errors import ConfigError, DamagedFileError, SinkscopeError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("sinkscope")
PACKAGE_DIR = Path(__file__).resolve().parent.parent
_GPU_LOCK: IO | None = None  # held for the life of the job process


def log_to(path: str | Path | None) -> None:
    """Send this job's log records and stderr (tracebacks included) to ``path``."""
    if path is None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stderr = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the job
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True
    )


def run_job(name: str, log_path: str | Path, function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Run one job: log to ``log_path``; on failure, the traceback goes to the log and one
    line to the console, and the process exits with status 1.

    A damaged input is moved aside (``sinkscope.pipeline.integrity.quarantine``), so that the next
    ``snakemake`` run rebuilds it; the line says so.
    """
    console = sys.__stderr__
    log_to(log_path)
    try:
        function(*args, **kwargs)
    except SinkscopeError as error:
        log.error("%s failed:\n%s", name, traceback.format_exc())
        message = _one_line(error, log_path)
        if isinstance(error, DamagedFileError):
            from sinkscope.pipeline.integrity import quarantine

            moved = quarantine(error.path)
            if moved:
                message += f"; moved aside to {moved}: run snakemake again to rebuild it"
        console.write(f"sinkscope: {name}: {message}\n")
        sys.exit(1)
    except Exception as error:  # noqa: BLE001 - a bug: say so, keep the traceback in the log
        log.error("%s failed:\n%s", name, traceback.format_exc())
        console.write(
            f"sinkscope: {name}: unexpected {type(error).__name__}: {_one_line(error)} (traceback in {log_path})\n"
        )
        sys.exit(1)


def _one_line(error: BaseException, log_path: str | Path | None = None) -> str:
    """The console's line for an error: its first line (the rest is in the log); a config
    error's every problem, one line each (each is something the user fixes)."""
    if isinstance(error, ConfigError) and len(error.problems) > 1:
        return str(error).strip()
    lines = str(error).strip().splitlines() or [type(error).__name__]
    more = f" (more in {log_path})" if len(lines) > 1 and log_path is not None else ""
    return lines[0] + more


# -- devices ---------------------------------------------------------------------------------------


def pick_device(option: str = "auto") -> torch.device:
    """The torch device of a job: 'cpu', 'cuda' (a free GPU of this machine), 'cuda:N', or auto.

    Several jobs at once on a multi-GPU machine (``--resources gpu=2``) take different
    GPUs: Snakemake counts GPUs but assigns none (``sinkscope.pipeline.resources.acquire_gpu``).
    """
    import torch

    global _GPU_LOCK
    if option == "auto":
        option = "cuda" if torch.cuda.is_available() else "cpu"
    if option.startswith("cuda"):
        visible = torch.cuda.device_count()
        index = int(option.partition(":")[2] or 0)
        if not visible:
            raise ConfigError(
                f"config key device: {option!r} was asked for, but no CUDA device is visible to this job (set device: "
                "cpu to compute on the CPU)"
            )
        if index >= visible:
            raise ConfigError(
                f"config key device: {option!r} was asked for, but only {visible} CUDA device(s) are visible"
            )
        if option == "cuda":
            from sinkscope.pipeline.resources import acquire_gpu

            index, _GPU_LOCK = acquire_gpu()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(option)


def device_name(device: torch.device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


# -- provenance ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def code_commit() -> str | None:
    """The git commit of the package source, when it runs from a checkout ("+dirty" if edited)."""
    try:
        run = functools.partial(subprocess.run, cwd=PACKAGE_DIR, capture_output=True, text=True, timeout=5)
        commit = run(["git", "rev-parse", "HEAD"])
        if commit.returncode != 0:
            return None
        dirty = run(["git", "status", "--porcelain", "--", str(PACKAGE_DIR)]).stdout.strip()
        return commit.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(stage: str, device: torch.device | None = None) -> dict[str, Any]:
    """Package version, commit and code digest of ``stage``; versions; the device if any."""
    from sinkscope.pipeline.codedigest import stage_digest

    info: dict[str, Any] = {
        "package_version": __version__,
        "code_commit": code_commit(),
        "code_digest": stage_digest(stage),
        "python_version": platform.python_version(),
    }
    if device is not None:
        import torch

        info |= {"torch_version": torch.__version__, "device_name": device_name(device), "device_kind": device.type}
    return info


def cuda_visible_devices() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")

"""The exception users see: a problem with their input, named in one line.

Everything the user can fix (a config key, a weights file, a damaged result) raises a
``SinkscopeError`` whose message names the file, key or value. The command line and
the Snakemake jobs turn it into one line on the console and keep the traceback in the
log (``sinkscope.pipeline.jobs.job_main``); anything else is a bug and is reported as one.
"""

from __future__ import annotations


class SinkscopeError(ValueError):
    """A user-fixable problem; the message names the file, key or value."""


class ConfigError(SinkscopeError):
    """A config that cannot run; the message names the key and the value."""

    @classmethod
    def invalid(cls, problems: list[str]) -> ConfigError:
        """Every problem found, each naming its key: one line for one problem, a list for several."""
        if len(problems) == 1:
            return cls(f"invalid config: {problems[0]}")
        return cls("invalid config:\n  " + "\n  ".join(problems))


class WeightsError(SinkscopeError):
    """Weights that do not fit the model, or a file that is not what its format says."""


class DamagedFileError(SinkscopeError):
    """A result file that fails its integrity checks (checksums, digest or contents)."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")

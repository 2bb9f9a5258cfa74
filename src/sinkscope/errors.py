"""The exception users see: a problem with their input, named in one line.

Everything the user can fix (a config key, a weights file, a damaged result) raises a
``SinkscopeError`` whose message names the file, key or value. The command line and
the Snakemake jobs turn it into one line on the console (a config check's listing: one
line per problem) and keep the traceback in the log (``sinkscope.pipeline.jobs.run_job``);
anything else is a bug and is reported as one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager


class SinkscopeError(ValueError):
    """A user-fixable problem; the message names the file, key or value."""


class ConfigError(SinkscopeError):
    """A config that cannot run; the message names the key and the value."""

    @classmethod
    def invalid(cls, problems: Sequence[str]) -> ConfigError:
        """Every problem found, each naming its key: one line for one problem, a list for
        several (each once, in the order found)."""
        problems = list(dict.fromkeys(problems))
        if len(problems) == 1:
            return cls(f"{_LISTING} {problems[0]}")
        return cls(f"{_LISTING}\n  " + "\n  ".join(problems))

    @property
    def problems(self) -> list[str]:
        """One line per problem: the lines of a listing (``invalid``), else the message. A
        check that gathers problems from others (the config check) adds theirs to its own
        listing, whichever error wrapped them on the way."""
        text = str(self)
        if text.startswith(_LISTING):
            return [line.strip() for line in text[len(_LISTING) :].splitlines() if line.strip()]
        return [text]


_LISTING = "invalid config:"


@contextmanager
def gathered(problems: list[str]) -> Iterator[None]:
    """Run a check whose ConfigError goes into ``problems`` (every line of it) instead of
    stopping the checks after it: ``with gathered(problems): check(...)``."""
    try:
        yield
    except ConfigError as error:
        problems.extend(error.problems)


class WeightsError(SinkscopeError):
    """Weights that do not fit the model, or a file that is not what its format says."""


class DamagedFileError(SinkscopeError):
    """A result file that fails its integrity checks (checksums, digest or contents)."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")

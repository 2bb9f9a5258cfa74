"""The one rule for names the user chooses, which become file and folder names.

Checkpoints, prompts, variants, legacy caches (and the prompt ids their rows get), sweeps
and each of their items, and command-line labels (``import-cache --checkpoint``) become
file and folder names under the study's results folder and Snakemake wildcard values.
Every place a name enters asks ``name_problem`` (the config check, the command line's
``arguments.name``, the legacy importer), so one rule refuses the same names everywhere,
in one line naming the key and the value:

- letters, digits and _ . + - only, a letter or digit first: no path separator, no
  leading dot (a hidden file, or '.' and '..'), nothing a file system or a shell mangles
  (spaces, quotes, ':' on Windows), no '@' (a source is ``<checkpoint>@<variant>``) and
  none of the characters Snakemake's patterns read ({ } * ? [ ]);
- no '..' anywhere (it reads as a path's parent wherever the name is split or joined);
- at most 64 characters;
- not ending in a substring repeated 20 times (Snakemake refuses such a wildcard value:
  it takes it for a rule applied to its own output);
- not a name sinkscope gives its own results (``layers0-3``, an extraction folder; a
  ``<table>.parquet`` dataset folder; ``<result>.damaged``, a result moved aside), which
  the integrity checks and ``sinkscope verify`` would take for one.

A sweep's variants are ``<sweep>/<item>``: the study makes that slash, so the rule
applies to the sweep's name and to each item apart, and a variant written by hand may be
named so too (``variant_name_problem``: one name, or two joined by one '/'). The schema's
``propertyNames`` pattern is ``NAME_PATTERN`` (``VARIANT_NAME_PATTERN`` for ``variants``;
a test keeps them equal), so Snakemake's own validation agrees. Validation code: not
part of any job's code digest (``pipeline.codedigest``).
"""

from __future__ import annotations

import re

from sinkscope.errors import ConfigError
from sinkscope.naming import is_group_folder

NAME_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9_.+-]*$"
NAME_MAX_LENGTH = 64
# A variant: a name, or <sweep>/<item> (a sweep's run, or the same run written by hand).
VARIANT_NAME_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9_.+-]*(/[A-Za-z0-9][A-Za-z0-9_.+-]*)?$"
VARIANT_NAME_MAX_LENGTH = 2 * NAME_MAX_LENGTH + 1
NAME_CHARACTERS = "letters, digits and _ . + - only, a letter or digit first"
_NAME = re.compile(NAME_PATTERN)
_PERIODIC = re.compile(r"(.+?)\1{19,}$")
_MOVED_ASIDE = re.compile(r"\.damaged(-\d+)?$")
_SEPARATORS = {"/": "a path separator", "\\": "a path separator (on Windows)"}


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot be a name that becomes a file, a folder and a Snakemake
    wildcard value, in a few words (the caller puts the key before them); None if it can."""
    if not isinstance(value, str):
        return f"the name {value!r} is a {type(value).__name__}; names must be strings (write '{value}' in quotes)"
    if not value:
        return "the name is empty"
    if len(value) > NAME_MAX_LENGTH:
        return f"name {value[:40]!r}... is longer than {NAME_MAX_LENGTH} characters"
    refused = f"name {value!r} is not allowed"
    for separator, what in _SEPARATORS.items():
        if separator in value:
            return f"{refused}: it holds {separator!r}, {what} (names become file and folder names; {NAME_CHARACTERS})"
    if ".." in value:
        return f"{refused}: it holds '..', a path's parent folder ({NAME_CHARACTERS})"
    if value.startswith("."):
        return f"{refused}: it starts with '.', a hidden file or a path part ({NAME_CHARACTERS})"
    if "@" in value:
        return f"{refused}: '@' joins a checkpoint and its variant in a source's name ({NAME_CHARACTERS})"
    if not _NAME.match(value):
        odd = sorted({char for char in value if not (char.isascii() and (char.isalnum() or char in "_.+-"))})
        if odd:
            return f"{refused}: it holds {', '.join(map(repr, odd))} ({NAME_CHARACTERS})"
        return f"{refused}: it starts with {value[0]!r} ({NAME_CHARACTERS})"
    periodic = _PERIODIC.search(value)
    if periodic:
        times = len(periodic.group(0)) // len(periodic.group(1))
        return (
            f"{refused}: it ends in {periodic.group(1)!r} repeated {times} times, which Snakemake refuses as a "
            "wildcard value"
        )
    if is_group_folder(value) or value.endswith(".parquet") or _MOVED_ASIDE.search(value):
        return (
            f"{refused}: it reads as a folder sinkscope writes itself (an extraction folder layers<N>, a "
            "<table>.parquet dataset, a <result>.damaged moved aside)"
        )
    return None


def variant_name_problem(value: object) -> str | None:
    """``name_problem`` for a variant's name, which may also be ``<sweep>/<item>``: two
    names joined by one '/' (two nested folders), each asked apart."""
    if not isinstance(value, str) or value.count("/") != 1:
        return name_problem(value)
    for part in value.split("/"):
        problem = name_problem(part)
        if problem is not None:
            return f"{problem} (in {value!r}, <sweep>/<item>)"
    return None


def check_name(value: object, where: str) -> str:
    """``value`` if it can be a name (``name_problem``); a ConfigError whose line starts
    with ``where`` (``config key prompts``, ``argument --checkpoint``) otherwise."""
    problem = name_problem(value)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")
    return value  # type: ignore[return-value]


def folded_collisions(names: list[str]) -> list[tuple[str, str]]:
    """Pairs of names that differ only in letter case: one folder on the case-insensitive
    file systems of macOS and Windows."""
    first: dict[str, str] = {}
    pairs = []
    for name in names:
        folded = name.casefold()
        if folded in first and first[folded] != name:
            pairs.append((first[folded], name))
        first.setdefault(folded, name)
    return pairs

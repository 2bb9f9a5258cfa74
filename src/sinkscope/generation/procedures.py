"""The generation procedures, one entry each: a ``loop.Procedure`` registered under its name.

A procedure's spec (what it refuses, the calls it makes, how many) is its row of
``sinkscope.options.PROCEDURE_TABLE`` (torch-free, for planning); its code is one
declaration, a ``Procedure`` (step rule and hooks around ``generation.loop``) registered
with ``register_procedure``. Importing ``sinkscope.generation`` imports every procedure
module, which fills the registry; ``sampler.generate`` runs the one
``generation.procedure`` names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import torch

from sinkscope.generation.common import GenerationObserver, GenerationResult
from sinkscope.generation.loop import Procedure
from sinkscope.model import WanModel
from sinkscope.options import PROCEDURE_TABLE, GenerationOptions, procedure_spec


class Generation(Protocol):
    """How the model calls of one video are made (``sampler.generate``'s signature)."""

    def __call__(
        self,
        model: WanModel,
        context: torch.Tensor | Sequence[tuple],
        *,
        options: GenerationOptions,
        seed: int,
        observers: Iterable[GenerationObserver] = (),
        vae: object | None = None,
    ) -> GenerationResult: ...


# Procedure name -> its declaration; filled by ``register_procedure`` as the modules are imported.
PROCEDURES: dict[str, Generation] = {}


def register_procedure(procedure: Procedure) -> Procedure:
    """Register ``procedure`` as the code of the procedure of its name, whose spec is that
    name's row of ``sinkscope.options.PROCEDURE_TABLE``; returns it."""
    name = procedure.name
    if name not in PROCEDURE_TABLE:
        raise ValueError(f"procedure {name!r} has no row in sinkscope.options.PROCEDURE_TABLE")
    if PROCEDURES.get(name, procedure) is not procedure:
        raise ValueError(f"procedure {name!r} is registered already ({PROCEDURES[name]!r})")
    PROCEDURES[name] = procedure
    return procedure


def unregister_procedure(name: str) -> None:
    """Forget the procedure registered under ``name`` (a test's own procedure, when it is done)."""
    PROCEDURES.pop(name, None)


def procedure_code(name: str) -> Generation:
    """The code of procedure ``name`` (an unknown name is refused as a config value)."""
    procedure_spec(name)
    if name not in PROCEDURES:
        raise ValueError(
            f"procedure {name!r} has a row in sinkscope.options.PROCEDURE_TABLE but no registered Procedure "
            "(a module of sinkscope.generation that calls register_procedure)"
        )
    return PROCEDURES[name]

"""The generation procedures, one entry each: a function registered under its name.

A procedure's spec (what it refuses, how many calls it makes) is its row of
``sinkscope.options.PROCEDURE_TABLE`` (torch-free, for planning); its code is one
function, ``@register_procedure(name)``, with ``generate``'s signature. Importing
``sinkscope.generation`` imports every procedure module, which fills the registry;
``sampler.generate`` runs the one ``generation.procedure`` names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

import torch

from sinkscope.generation.common import GenerationObserver, GenerationResult
from sinkscope.model import WanModel
from sinkscope.options import PROCEDURE_TABLE, GenerationOptions, procedure_spec


class Procedure(Protocol):
    """How the model calls of one video are made (``sampler.generate``'s signature)."""

    def __call__(
        self,
        model: WanModel,
        context: torch.Tensor | Sequence[tuple[int, torch.Tensor]],
        *,
        options: GenerationOptions,
        seed: int,
        observers: Iterable[GenerationObserver] = (),
    ) -> GenerationResult: ...


# Procedure name -> its function; filled by ``register_procedure`` as the modules are imported.
PROCEDURE_FUNCTIONS: dict[str, Procedure] = {}
_Function = TypeVar("_Function", bound=Callable[..., GenerationResult])


def register_procedure(name: str) -> Callable[[_Function], _Function]:
    """Function decorator: the function is the code of procedure ``name``, whose spec is
    that name's row of ``sinkscope.options.PROCEDURE_TABLE``."""
    if name not in PROCEDURE_TABLE:
        raise ValueError(f"procedure {name!r} has no row in sinkscope.options.PROCEDURE_TABLE")

    def register(function: _Function) -> _Function:
        if PROCEDURE_FUNCTIONS.get(name, function) is not function:
            raise ValueError(f"procedure {name!r} is registered already ({PROCEDURE_FUNCTIONS[name].__qualname__})")
        PROCEDURE_FUNCTIONS[name] = function
        return function

    return register


def procedure_function(name: str) -> Procedure:
    """The function of procedure ``name`` (an unknown name is refused as a config value)."""
    procedure_spec(name)
    return PROCEDURE_FUNCTIONS[name]

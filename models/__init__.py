"""Explicit registry of the model families.

Each family lives in its own module and exposes a ``FAMILY`` record (see
:mod:`models.base`). Modules are imported on first use so that ``import models`` stays
cheap for the CLI and for Ray workers that only need one family.
"""

from __future__ import annotations

import importlib

from models.base import Family

__all__ = ["FAMILY_MODULES", "all_families", "family_names", "get_family"]

# name -> module. The order is the order `hpo models` and `hpo profile --all` print.
FAMILY_MODULES: dict[str, str] = {
    "dqn": "models.dqn",
    "ppo": "models.ppo",
    "tft": "models.tft",
    "mamba2": "models.mamba2",
    "tggn": "models.tggn",
    "tlob": "models.tlob",
    "liquid": "models.liquid",
    "kan": "models.kan",
    "xlstm": "models.xlstm",
    "diffusion": "models.diffusion",
}


def family_names() -> tuple[str, ...]:
    return tuple(FAMILY_MODULES)


def get_family(name: str) -> Family:
    """The family called ``name``; an unknown name is an error listing the known ones."""
    try:
        module_name = FAMILY_MODULES[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(FAMILY_MODULES)}"
        ) from None
    family: Family = importlib.import_module(module_name).FAMILY
    return family


def all_families() -> list[Family]:
    return [get_family(name) for name in FAMILY_MODULES]

"""The model families: the ten registered here, those installed packages register, and any
a spec names by import reference.

A family is named by its registered name (``"liquid"``), a name an installed package
registers under the entry-point group ``foxhunt_hpo.families`` (``desk_gru =
"desk_models.gru:FAMILY"`` in its pyproject's ``[project.entry-points."foxhunt_hpo.families"]``),
or an import reference ``"package.module:ATTR"`` to a :class:`models.base.Family`. That
string is what a spec, a trial's config and a checkpoint record, so a Ray worker or a
later ``hpo predict`` resolves the same family (its module must import there). Modules are
imported on first use, so ``import models`` stays cheap for the CLI and for Ray workers
that need one family. The contract a family meets: docs/families.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
from types import ModuleType

from models.family import CONTRACT_VERSION, IMPORTABLE_WHERE, Family, Network

__all__ = [
    "ENTRY_POINT_GROUP",
    "FAMILY_MODULES",
    "FamilyError",
    "all_families",
    "family_module",
    "family_names",
    "get_family",
    "installed_names",
    "is_reference",
]

ENTRY_POINT_GROUP = "foxhunt_hpo.families"

# name -> module. The order is the order `hpo families` and `hpo profile --all` print.
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

_RESOLVED: dict[str, Family] = {}


class FamilyError(ValueError):
    """A family that cannot be named, imported or used (the message says which and why)."""


def family_names() -> tuple[str, ...]:
    """The registered families, in print order (the ten; see :func:`installed_names`)."""
    return tuple(FAMILY_MODULES)


def installed_names() -> dict[str, str]:
    """Families installed packages register: name -> import reference (built-in names
    cannot be taken)."""
    found = {}
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in FAMILY_MODULES:
            found[entry.name] = entry.value
    return found


def is_reference(name: str) -> bool:
    """``"package.module:ATTR"``: an import reference rather than a name."""
    return ":" in name


def get_family(name: str) -> Family:
    """The family ``name`` names: a registered or installed name, or an import reference.
    Anything else is a :class:`FamilyError` naming what is known, or why the reference
    does not resolve (the module's import error, or what the attribute is instead)."""
    cached = _RESOLVED.get(name)
    if cached is not None:
        return cached
    if name in FAMILY_MODULES:
        family: Family = importlib.import_module(FAMILY_MODULES[name]).FAMILY
        return family
    installed = installed_names()
    reference = installed.get(name, name)
    if not is_reference(reference):
        known = [*FAMILY_MODULES, *installed]
        raise FamilyError(
            f"unknown family {name!r}; known families: {', '.join(known)}; or name a family "
            "of your own by import reference, 'package.module:ATTR'"
        )
    family = _resolve(name, reference)
    _RESOLVED[name] = family
    return family


def family_module(name: str) -> ModuleType:
    """The module that defines family ``name``."""
    if name in FAMILY_MODULES:
        return importlib.import_module(FAMILY_MODULES[name])
    reference = installed_names().get(name, name)
    return importlib.import_module(reference.partition(":")[0])


def _resolve(name: str, reference: str) -> Family:
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise FamilyError(f"family {name!r}: an import reference is 'package.module:ATTR'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the module's own error: missing, or failing to import
        raise FamilyError(
            f"family {name!r}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc}); {IMPORTABLE_WHERE}"
        ) from exc
    try:
        found = getattr(module, attribute)
    except AttributeError:
        raise FamilyError(
            f"family {name!r}: module {module_name!r} has no attribute {attribute!r}"
        ) from None
    if not isinstance(found, Family):
        raise FamilyError(
            f"family {name!r}: {reference} is a {type(found).__name__}, not a "
            "models.base.Family (docs/families.md)"
        )
    _check_contract(name, found)
    return found


def _check_contract(name: str, family: Family) -> None:
    """Refuse a family written for a contract this release does not implement."""
    if family.contract > CONTRACT_VERSION:
        raise FamilyError(
            f"family {name!r} was written for family contract {family.contract}; this "
            f"foxhunt-hpo implements {CONTRACT_VERSION}: upgrade foxhunt-hpo"
        )
    if family.contract < 1:
        raise FamilyError(f"family {name!r}: contract must be >= 1, got {family.contract}")
    if family.kind not in ("forecast", "rl"):
        raise FamilyError(f"family {name!r}: kind must be 'forecast' or 'rl', got {family.kind!r}")
    if not dataclasses.is_dataclass(family.config_cls):
        raise FamilyError(f"family {name!r}: config_cls must be a dataclass")
    fields = set(family.config_fields())
    named = set(family.search_space) | family.shape_settings | family.per_trial_settings
    unknown = (named | set(family.tiny)) - fields
    if unknown:
        raise FamilyError(
            f"family {name!r}: search_space, shape_settings, per_trial_settings and tiny name "
            f"settings its config {family.config_cls.__name__} does not have: {sorted(unknown)}"
        )
    if family.per_trial_settings & family.shape_settings:
        raise FamilyError(
            f"family {name!r}: {sorted(family.per_trial_settings & family.shape_settings)} are "
            "both shape_settings and per_trial_settings (a group trial's trials share shapes)"
        )
    if isinstance(family.build, Network):
        problem = family.build.problem()
        if problem is not None:  # here, before launch, not in each trial's worker
            raise FamilyError(f"family {name!r}: {problem}")


def all_families() -> list[Family]:
    """The registered families, then the installed ones."""
    return [get_family(name) for name in (*FAMILY_MODULES, *installed_names())]

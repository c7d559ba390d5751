"""Search: the spec's search spaces, the parameter searchers, and Ray Tune's searcher over them.

:func:`make_param_searcher` is the one place a searcher kind becomes a
:class:`~hpo.search.param_searcher.ParamSearcher` (as Ray keeps ``create_searcher`` in
``ray.tune.search``); the implementations are imported when chosen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpo.search.param_searcher import ParamSearcher
    from hpo.search.space import TrialSpace

KINDS = ("tpe", "random", "pso")

__all__ = ["KINDS", "make_param_searcher"]


def make_param_searcher(kind: str, space: TrialSpace, seed: int) -> ParamSearcher:
    """The parameter searcher ``kind`` (one of :data:`KINDS`) over ``space``'s dimensions."""
    if kind in ("tpe", "random"):
        from hpo.search.optuna_searcher import OptunaParamSearcher

        return OptunaParamSearcher(space.dims, kind=kind, seed=seed)
    if kind == "pso":
        from hpo.search.pso import PSOParamSearcher

        return PSOParamSearcher(space.dims, seed=seed)
    raise ValueError(f"unknown search algorithm {kind!r}; allowed: {list(KINDS)}")

"""What a sweep stream's parameter searcher does (:func:`hpo.search.make_param_searcher` chooses one).

:class:`ParamSearcher` is the interface :class:`~hpo.search.sweep_searcher.SweepSearcher`
drives, as optuna's ``BaseSampler`` is the one its studies drive: ask for parameters under
a token, tell the token's result, and save / restore the whole state as plain JSON data
(``hpo resume`` continues the same search, nothing pickled). Implemented by
:class:`~hpo.search.optuna_searcher.OptunaParamSearcher` (TPE, random) and
:class:`~hpo.search.pso.PSOParamSearcher`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ParamSearcher(Protocol):
    """Ask-and-tell search over one space; tokens name the outstanding suggestions."""

    def ask(self, token: str, fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Parameters (name -> value) for the suggestion ``token``; dimensions named in
        ``fixed`` take its values (a group's shared shape) and the rest are searched."""
        ...

    def tell(self, token: str, value: float | None) -> None:
        """The result of ``token``; None or a non-finite value marks a failed trial. An
        unknown or already told token is ignored."""
        ...

    @property
    def n_told(self) -> int:
        """Results told so far, failures included."""
        ...

    def best(self) -> tuple[dict[str, Any], float] | None:
        """The best told parameters and their value, or None before any success."""
        ...

    def state(self) -> dict[str, Any]:
        """The whole state as JSON-serializable data, outstanding tokens included."""
        ...

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` of a searcher built over the same space."""
        ...

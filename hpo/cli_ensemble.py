"""``hpo ensemble``: combine a sweep's best trials into one served checkpoint.

    hpo ensemble hpo-results/quick --top 2 --weighting stacked --out ensembles/quick
    hpo predict --checkpoint ensembles/quick --data bars.csv --out positions.csv
    python -m hpo.cli_ensemble hpo-results/quick --out ensembles/quick   (same, standalone)

Registered in :mod:`hpo.cli` as ``app.command("ensemble")(ensemble_cmd)``; the body is
:func:`run_ensemble_command`, a plain function of typed arguments.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from hpo.cli_options import (
    JsonFlag,
    SweepDirArg,
    TrackingCredentials,
    console,
    exit_on_user_error,
    fail,
    titled_table,
)


def _split(values: list[str] | None) -> list[str]:
    """Repeatable options that also take comma-separated lists (``--models tft,dqn``)."""
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()]


def run_ensemble_command(
    sweep_dir: str,
    out: Path,
    top: int = 1,
    models: list[str] | None = None,
    precision: list[str] | None = None,
    weighting: str = "psr",
    policy: str = "auto",
    device: str = "auto",
    as_json: bool = False,
) -> dict[str, Any]:
    """Build, write and log the ensemble; print its members and the test comparison.
    Returns the summary it prints (members, weights, metrics, MLflow run id)."""
    from hpo.ensemble import build_ensemble
    from trainables.trainer import resolve_device

    result = build_ensemble(
        sweep_dir,
        out,
        top=top,
        models=_split(models),
        precisions=_split(precision),
        weighting=weighting,
        device=resolve_device(device),
        policy=policy,
    )
    summary = {
        "out": str(result.out),
        "mlflow_run_id": result.run_id,
        "weighting": weighting,
        "members": [
            {**spec.to_dict(), "best_single": i == result.best_member}
            for i, spec in enumerate(result.specs)
        ],
        "metrics": result.metrics,
    }
    if as_json:
        console.print_json(json.dumps(summary, default=str))
        return summary
    table = titled_table(
        f"ensemble ({weighting}) of {len(result.specs)} trials",
        *("member", "trial", "model", "precision", "val Sharpe", "weight"),
    )
    for i, spec in enumerate(result.specs):
        mark = " *" if i == result.best_member else ""
        table.add_row(
            spec.name + mark,
            spec.trial_id,
            spec.family,
            spec.precision,
            f"{spec.val_sharpe:+.3f}" if spec.val_sharpe is not None else "-",
            f"{spec.weight:.3f}",
        )
    console.print(table)
    compare = titled_table(
        "held-out test: ensemble vs best single member (*)",
        *("metric", "ensemble", "best member"),
        justify="right",
    )
    for key in ("sharpe", "sortino", "max_drawdown", "turnover", "hit_rate"):
        m = result.metrics
        compare.add_row(key, f"{m[f'test_{key}']:.4f}", f"{m[f'best_member.test_{key}']:.4f}")
    m = result.metrics
    compare.add_row(
        "val_dsr (n+1 trials)", f"{m['val_dsr']:.4f}", f"{m['best_member.val_dsr']:.4f}"
    )
    console.print(compare)
    console.print(
        f"ensemble checkpoint {result.out} (MLflow run {result.run_id}); serve it: "
        f"hpo predict --checkpoint {result.out} --data BARS --out positions.csv"
    )
    return summary


def ensemble_cmd(
    sweep_dir: SweepDirArg,
    out: Annotated[Path, typer.Option(help="Directory to write the ensemble checkpoint to.")],
    top: Annotated[int, typer.Option(min=1, help="Best trials per family (by val Sharpe).")] = 1,
    models: Annotated[
        list[str] | None, typer.Option(help="Only these families (repeatable or a,b).")
    ] = None,
    precision: Annotated[
        list[str] | None, typer.Option(help="Only trials of these precisions (repeatable).")
    ] = None,
    weighting: Annotated[
        str, typer.Option(help="psr, inverse-variance, equal or stacked (validation only).")
    ] = "psr",
    policy: Annotated[
        str, typer.Option(help="Policy members run in; auto = bf16 on Ampere+, else f32.")
    ] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda[:N].")] = "auto",
    as_json: JsonFlag = False,
    tracking_credentials: TrackingCredentials = None,  # applied as it is parsed
) -> None:
    """Combine the best trials per family, chosen and weighted on validation only."""
    from hpo.ensemble import EnsembleError
    from hpo.record import SweepError
    from trainables.checkpoint import CheckpointError

    try:
        run_ensemble_command(
            sweep_dir, out, top, models, precision, weighting, policy, device, as_json
        )
    except (EnsembleError, SweepError, CheckpointError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))


if __name__ == "__main__":
    import os

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    exit_on_user_error(lambda: typer.run(ensemble_cmd))

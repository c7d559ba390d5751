"""``hpo`` commands that read a sweep's results: the paired precision comparison
(``hpo compare``, recomputed from MLflow) and an ensemble of its best trials
(``hpo ensemble``, one served checkpoint).

    hpo compare --experiment NAME --tracking-uri http://127.0.0.1:5000 [--html report.html]
    hpo ensemble hpo-results/quick --top 2 --weighting stacked --out ensembles/quick
    hpo predict --checkpoint ensembles/quick --data bars.csv --out positions.csv

The statistics are :mod:`hpo.compare`'s and the ensemble :mod:`hpo.ensemble`'s; the body
of ``hpo ensemble`` is :func:`run_ensemble_command`, a plain function of typed arguments.
MLflow and torch are imported inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from hpo.cli._options import (
    JsonFlag,
    SweepDirArg,
    TrackingCredentials,
    check_tracking_access,
    console,
    fail,
    titled_table,
)


def compare_cmd(
    experiment: Annotated[str, typer.Option(help="MLflow experiment (= the sweep name).")],
    tracking_uri: Annotated[
        str, typer.Option(help="MLflow tracking URI of the sweep.")
    ] = "sqlite:///mlflow.db",
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the full comparison as JSON.")
    ] = None,
    html_path: Annotated[
        Path | None, typer.Option("--html", help="Also write the HTML report (self-contained).")
    ] = None,
    log: Annotated[
        bool,
        typer.Option(
            "--log/--no-log", help="Write the statistics and report onto the sweep's parent run."
        ),
    ] = False,
    precision: Annotated[
        list[str] | None,
        typer.Option(
            "--precision",
            help="Precisions to compare, reference first (repeat; default: the sweep's own).",
        ),
    ] = None,
    parent_run_id: Annotated[
        str | None, typer.Option(help="The sweep's parent run (default: the newest).")
    ] = None,
    margin: Annotated[
        float | None,
        typer.Option(
            help="Equivalence margin on the paired annualised Sharpe difference (> 0; "
            "default: the sweep's [comparison] margin, else 0.1).",
        ),
    ] = None,
    wide: Annotated[
        bool,
        typer.Option(
            "--wide", help="Every statistic per family and split (the default fits 100 columns)."
        ),
    ] = False,
    tracking_credentials: TrackingCredentials = None,
) -> None:
    """Paired precision comparison of a sweep, recomputed from MLflow alone (finished or not).

    Prints the TOST equivalence verdict (overall and per family, against the margin), what
    each precision cost (GPU-hours, or CPU-hours off GPU, paired by configuration), a table
    that fits 100 columns, and PBO, MinTRL and the val/test Spearman; with --wide, per
    family and split, the Wilcoxon signed-rank test and Hodges-Lehmann CI of the
    per-configuration Sharpe differences (MWU/KS descriptive), diverged/fallback counts
    and the DSR of the best trial. The report adds the per-pair tests on the trials'
    return series (their returns/returns.csv artifacts): the block bootstrap
    (BH-adjusted), with HAC beside it and JKM as descriptive.
    """
    from dashboards.report import render_report
    from dashboards.tables import rich_tables
    from hpo.compare import ComparisonError, comparison_from_mlflow, log_comparison
    from hpo.mlflow_links import sweep_links

    # A refused login is one clear error here, not an MLflow traceback (or its retries).
    check_tracking_access(tracking_uri, tracking_credentials)
    try:
        comparison = comparison_from_mlflow(
            experiment,
            tracking_uri,
            precisions=precision or None,
            parent_run_id=parent_run_id,
            margin=margin,
            # The curves are one MLflow call per trial, read for what shows them (the
            # report, the JSON): the terminal's tables do not (bench/compare_scale.py).
            with_curves=html_path is not None or json_path is not None or log,
        )
    except ComparisonError as exc:
        fail(str(exc))
    for table in rich_tables(comparison, wide=wide):
        console.print(table)
    for note in comparison.notes:
        console.print(f"[yellow]note:[/] {note}")
    for line in sweep_links(tracking_uri, experiment, comparison.parent_run_id):
        console.print(line, soft_wrap=True)
    html = None
    if html_path is not None or log:
        html = render_report(comparison)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(comparison.to_dict(), indent=1, allow_nan=False))
        console.print(f"JSON: {json_path}")
    if html_path is not None and html is not None:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(html, encoding="utf-8")
        console.print(f"report: {html_path}")
    if log:
        logged = log_comparison(
            comparison, tracking_uri, comparison.parent_run_id, report_html=html
        )
        console.print(
            f"logged {len(logged)} cmp.* metrics and comparison/report.html on parent run "
            f"{comparison.parent_run_id}"
        )


def _split(values: list[str] | None) -> list[str]:
    """Repeatable options that also take comma-separated lists (``--family tft,dqn``)."""
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()]


def run_ensemble_command(
    sweep_dir: str,
    out: Path,
    top: int = 1,
    families: list[str] | None = None,
    of_precision: list[str] | None = None,
    weighting: str = "psr",
    precision: str = "auto",
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
        families=_split(families),
        precisions=_split(of_precision),
        weighting=weighting,
        device=resolve_device(device),
        precision=precision,
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
        *("member", "trial", "family", "precision", "val Sharpe", "weight"),
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
    families: Annotated[
        list[str] | None,
        typer.Option("--family", help="Only these families (repeatable or a,b)."),
    ] = None,
    of_precision: Annotated[
        list[str] | None,
        typer.Option(help="Only trials of these precisions (repeatable or a,b)."),
    ] = None,
    weighting: Annotated[
        str, typer.Option(help="psr, inverse-variance, equal or stacked (validation only).")
    ] = "psr",
    precision: Annotated[
        str, typer.Option(help="Precision members run in; auto = bf16 on Ampere+, else f32.")
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
            sweep_dir, out, top, families, of_precision, weighting, precision, device, as_json
        )
    except (EnsembleError, SweepError, CheckpointError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))

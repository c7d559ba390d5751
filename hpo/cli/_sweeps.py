"""``hpo`` commands for sweeps: run one on Ray Tune (``hpo sweep``), continue it
(``hpo resume``), and read where it stands (``hpo status``) and its best trials
(``hpo best``) from its directory.

    hpo sweep spec.toml [--address auto] [--compare] [--plan]
    hpo resume hpo-results/NAME
    hpo status hpo-results/NAME [--json]
    hpo best hpo-results/NAME [--family tft] [--precision bf16]

A sweep that stops before every planned trial ends exits 3 (:data:`EXIT_INTERRUPTED`):
``hpo resume`` continues it. Ray and MLflow are imported inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hpo.cli._options import (
    CompareFlag,
    JsonFlag,
    NameOption,
    RayAddress,
    SpecArg,
    SweepDirArg,
    TrackingCredentials,
    check_tracking_access,
    console,
    fail,
    load_sweep_spec,
    titled_table,
)
from trainables.memory import pause_collection

if TYPE_CHECKING:
    from cluster.storage import SweepLocation
    from hpo.compare import Comparison
    from hpo.sweep import SweepRows


def sweep_cmd(
    spec_path: SpecArg,
    address: RayAddress = None,
    storage: Annotated[
        str | None, typer.Option(help="Results and checkpoints root (overrides the spec).")
    ] = None,
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow tracking URI (overrides the spec).")
    ] = None,
    name: NameOption = None,
    compare: CompareFlag = False,
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="Print the plan and exit without launching (no sweep directory, no MLflow "
            "run): in compare mode what each family can decide (the comparison plan), then "
            "the GPU packing plan (profiled on the GPU nodes).",
        ),
    ] = False,
    num_gpus: Annotated[
        int | None,
        typer.Option(
            help="Local Ray only: the GPUs it offers (default: those it detects; logical "
            "GPUs without CUDA are packed from estimates)."
        ),
    ] = None,
    tracking_credentials: TrackingCredentials = None,
) -> None:
    """Run a sweep: Ray Tune trials of the shared trainer, tracked in MLflow."""
    pause_collection()  # its imports (trainables.memory); hpo.sweep resumes it before Tune
    from hpo.record import SweepError
    from hpo.sweep import plan_only, run_sweep

    spec = load_sweep_spec(spec_path, storage, tracking_uri, name, compare)
    if num_gpus is not None and address is not None:
        fail("--num-gpus sets up a local Ray; a cluster at --address declares its own GPUs")
    if plan:
        if spec.compare:  # from the spec alone: said even where the GPU plan fails
            from hpo.compare.plan import comparison_plan_text

            console.print(comparison_plan_text(spec), markup=False, highlight=False)
        try:
            text = plan_only(spec, address=address, num_gpus=num_gpus).text
        except SweepError as exc:
            fail(str(exc))
        console.print(text, markup=False, highlight=False)
        return
    # Before Ray starts: a refused login fails here, not as retries in the outbox.
    check_tracking_access(spec.tracking_uri, tracking_credentials)
    grouped = (
        f" as {spec.n_tune_trials} Tune trials (groups of up to {spec.group_size})"
        if spec.forms_groups
        else ""
    )
    scheduler = (
        "asha per trial"
        if spec.asha_per_trial
        else "pbt, asha across populations"
        if spec.asha_per_population
        else spec.scheduler
    )
    # A sequential comparison's n_trials is its most: families decided early run fewer.
    trials = f"up to {spec.n_trials} trials" if spec.sequential else f"{spec.n_trials} trials"
    console.print(
        f"sweep [bold]{spec.name}[/]: {trials}{grouped} ({', '.join(spec.families)} "
        f"x {', '.join(spec.precisions)}; {spec.search} + {scheduler}), MLflow at "
        f"{spec.tracking_uri}"
    )
    try:
        rows = run_sweep(
            spec,
            address=address,
            on_event=_print_event,
            num_gpus=num_gpus,
            render_report=_render_report,
        )
    except SweepError as exc:
        fail(str(exc))
    _print_sweep_result(rows, _sweep_dir(spec.storage, spec.name), spec.tracking_uri)
    _exit_if_interrupted(rows)


def resume_cmd(
    sweep_dir: Annotated[
        str,
        typer.Argument(
            metavar="SWEEP_DIR",
            help="STORAGE/NAME of an interrupted sweep (a path or an object-store URI).",
        ),
    ],
    address: RayAddress = None,
    tracking_credentials: TrackingCredentials = None,
) -> None:
    """Continue an interrupted sweep from its checkpoints (finished trials are not re-run).

    Ray Tune unpickles the sweep's saved state, which runs code as you: only resume
    storage you trust. A local SWEEP_DIR that other users can write is refused."""
    pause_collection()  # its imports (trainables.memory); hpo.sweep resumes it before Tune
    from hpo.record import SweepError, SweepRecord
    from hpo.sweep import resume_sweep

    try:
        record = SweepRecord.read(sweep_dir)
        check_tracking_access(record.tracking_uri, tracking_credentials)
        console.print(f"resuming sweep [bold]{record.spec.name}[/] in {record.sweep_dir}")
        rows = resume_sweep(
            sweep_dir, address=address, on_event=_print_event, render_report=_render_report
        )
    except SweepError as exc:
        fail(str(exc))
    _print_sweep_result(rows, record.sweep_dir, record.tracking_uri)
    _exit_if_interrupted(rows)


def status_cmd(
    sweep_dir: SweepDirArg,
    as_json: JsonFlag = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Also write the population report (population-based training sweeps): "
            "each member's settings over epochs, and who copied whom.",
        ),
    ] = None,
    tracking_credentials: TrackingCredentials = None,
) -> None:
    """Where a sweep stands: every trial's status, epochs and validation Sharpe."""
    pause_collection()  # its imports (trainables.memory): it reads the sweep and ends
    from hpo.record import SweepError, SweepRecord
    from hpo.trials import latest_attempts, spent_hours, trial_rows

    try:
        record = SweepRecord.read(sweep_dir, check_data=False)
    except SweepError as exc:
        fail(str(exc))
    population = record.spec.scheduler == "pbt"
    if html is not None and not population:
        fail(
            f"--html: {record.sweep_dir} is not a population-based training sweep "
            f"(scheduler = {record.spec.scheduler!r}); the report of a comparison is "
            "`hpo compare --html`"
        )
    attempts = trial_rows(record.sweep_dir, retried=True)
    rows = latest_attempts(attempts)
    spent = spent_hours(attempts)
    if html is not None:
        from dashboards.population_report import render_population_report

        html.write_text(render_population_report(record.spec.name, rows))
    exploits = sum(r.exploits for r in rows)
    if as_json:
        payload = {
            "planned": record.spec.n_trials,
            "trials": [r.to_dict() for r in rows],
            "spent": spent,
            **({"exploits": exploits} if population else {}),
        }
        console.print_json(json.dumps(payload, default=str))
        return
    up_to = "up to " if record.spec.sequential else ""
    title = f"{record.spec.name}: {len(rows)} of {up_to}{record.spec.n_trials} trials started"
    columns = ("trial", "family", "precision", "seed", "pair", "status", "epochs", "val Sharpe")
    table = titled_table(title, *columns, *(("exploits",) if population else ()), "note")
    for r in rows:
        note = "diverged" if r.diverged else "fell back to f32" if r.fell_back_to_f32 else ""
        table.add_row(
            r.trial_id,
            r.family,
            r.precision,
            str(r.seed),
            r.pair_id,
            r.status,
            str(r.epochs),
            _num(r.val_sharpe),
            *((str(r.exploits),) if population else ()),
            note,
        )
    console.print(table)
    if population:
        console.print(f"population-based training: {exploits} exploits so far")
        if html is not None:
            console.print(f"population report: {html}")
    console.print(_spent_line(spent))
    _print_links(record.tracking_uri, record.sweep_dir)


def best_cmd(
    sweep_dir: SweepDirArg,
    family: Annotated[str | None, typer.Option(help="Only this family.")] = None,
    precision: Annotated[str | None, typer.Option(help="Only this precision.")] = None,
    as_json: JsonFlag = False,
    tracking_credentials: TrackingCredentials = None,
) -> None:
    """The best trial per family and precision, with the checkpoint `hpo train --resume` takes."""
    pause_collection()  # its imports (trainables.memory): it reads the sweep and ends
    from hpo.record import SweepError, SweepRecord
    from hpo.trials import best_rows, trial_rows

    try:
        record = SweepRecord.read(sweep_dir, check_data=False)
    except SweepError as exc:
        fail(str(exc))
    best = best_rows(trial_rows(record.sweep_dir), family=family, precision=precision)
    if as_json:
        console.print_json(json.dumps([r.to_dict() for r in best], default=str))
        return
    if not best:
        fail("no finished trial with a validation Sharpe matches")
    _print_best(best)
    console.print(
        "continue one alone: hpo train --resume CHECKPOINT --out DIR [--precision f32] [--epochs N]"
    )


EXIT_INTERRUPTED = 3


def _print_event(line: str) -> None:
    """A sweep's progress line or plan, as it is (no rich markup in trial names or tables)."""
    console.print(line, markup=False, highlight=False)


def _render_report(comparison: Comparison) -> str:
    """The comparison report (dashboards.report), imported once a compare sweep renders
    it: its statistics import scipy.stats and hpo.compare, about half a second of CPU
    that a sweep comparing nothing does not spend (before Ray's start, on the same CPUs)."""
    from dashboards.report import render_report

    return render_report(comparison)


def _exit_if_interrupted(rows: SweepRows) -> None:
    """A sweep that stopped before it was complete (every planned trial ended, every
    sequential family decided) exits 3 (resumable)."""
    if not rows.complete:
        raise typer.Exit(EXIT_INTERRUPTED)


def _sweep_dir(storage: str, name: str) -> SweepLocation:
    from cluster.storage import SweepLocation

    return SweepLocation.parse(storage).child(name)


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:+.3f}"


def _print_best(best: list[Any]) -> None:
    table = titled_table(
        "best trial per family and precision (final validation Sharpe)",
        *("family", "precision", "val Sharpe", "test Sharpe", "trial", "config", "checkpoint"),
        overflow="fold",
    )
    for r in best:
        # A population trial finished with the settings its exploits left it, not the
        # ones the sweep started it with: those are shown, and said to have changed.
        finished = {**r.params, **r.explored}
        config = ", ".join(f"{k}={_short(v)}" for k, v in sorted(finished.items()))
        if r.explored:
            started = ", ".join(
                f"{k}={_short(r.params[k]) if k in r.params else 'default'}"
                for k in sorted(r.explored)
            )
            config += (
                f" (finished with the settings population-based training explored over "
                f"{r.exploits} exploits; it started with {started})"
            )
        table.add_row(
            r.family,
            r.precision,
            _num(r.val_sharpe),
            _num(r.test_sharpe),
            r.trial_id,
            config,
            r.checkpoint or "—",
        )
    console.print(table)


def _spent_line(spent: dict[str, dict[str, float]]) -> str:
    """``spent so far: 0.42 GPU-hours, 0.10 CPU-hours (f32 0.30 / 0.06, bf16 ...)``."""
    by_precision = ", ".join(
        f"{p} {h['gpu_hours']:.2f} / {h['cpu_hours']:.2f}" for p, h in spent.items() if p != "all"
    )
    total = spent["all"]
    line = f"spent so far: {total['gpu_hours']:.2f} GPU-hours, {total['cpu_hours']:.2f} CPU-hours"
    if by_precision:
        line += f" (GPU / CPU: {by_precision})"
    if total["gpu_hours"] == 0.0:
        line += "; no trial has run on a GPU"
    return line


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _print_links(tracking_uri: str, sweep_dir: SweepLocation | Path | str) -> None:
    """The MLflow UI's deep link to the sweep's trials (``hpo.mlflow_links``)."""
    from cluster.storage import SweepLocation
    from hpo.mlflow_links import sweep_links
    from hpo.record import SweepError, SweepRecord

    try:
        record = SweepRecord.read(sweep_dir, check_data=False)
        name, parent = record.spec.name, record.parent_run_id
    except SweepError:
        name, parent = SweepLocation.parse(sweep_dir).name, None
    for line in sweep_links(tracking_uri, name, parent):
        console.print(line, soft_wrap=True)  # a link folded over lines does not open


def _print_sweep_result(rows: SweepRows, sweep_dir: SweepLocation, tracking_uri: str) -> None:
    from hpo.trials import best_rows

    done = sum(r.done for r in rows)
    diverged = sum(r.diverged for r in rows)
    fell_back = sum(r.fell_back_to_f32 for r in rows)
    console.print(
        f"{done}/{rows.planned} trials finished ({len(rows) - done} not finished; {diverged} diverged, "
        f"{fell_back} fell back to f32) in {sweep_dir}"
    )
    best = best_rows(rows)
    if best:
        _print_best(best)
    if rows.comparison is not None:
        # Imported here: the tables import hpo.compare and with it scipy.stats (half a
        # second to a second of one core), which a sweep that compares nothing never needs.
        from dashboards.tables import family_lines

        for line in family_lines(rows.comparison):
            console.print(line, markup=False, highlight=False)
    if not rows.complete:
        console.print(f"[yellow]interrupted: continue with[/] hpo resume {sweep_dir}")
    _print_links(tracking_uri, sweep_dir)

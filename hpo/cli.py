"""The ``hpo`` command line.

    hpo models                                         families and their search spaces
    hpo train --model tft --precision bf16 --out runs/tft-bf16 [--epochs 5] [--set lr=3e-4]
    hpo train --resume runs/tft-bf16 [--precision f32] [--epochs 8] [--device cpu]
    hpo predict --checkpoint runs/tft-bf16 --data bars.csv --out positions.csv
    hpo tracking-server --store ~/mlflow-store                  MLflow server on 127.0.0.1:5000
    hpo submit spec.toml --address http://HEAD:8265 --storage /shared/hpo \
        --tracking-uri http://127.0.0.1:5000 --follow            sweep on a Ray cluster (Jobs API)
    hpo jobs --address http://HEAD:8265                         the cluster's jobs

Heavy imports (torch, ray, mlflow) happen inside the commands so ``hpo --help`` is instant.
"""

from __future__ import annotations

import os

# Ray reads this once, when it is imported: with 0 an embedded local Ray (`hpo sweep`
# without --address, `make demo`) binds its services to 127.0.0.1; Ray's default on Linux
# is every interface. Set here, before anything imports ray; an explicit value is kept.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from cluster.storage import is_uri
from hpo.cli_options import (
    Assignments,
    CompareFlag,
    JobsAddress,
    JsonFlag,
    NameOption,
    RayAddress,
    SpecArg,
    SweepDirArg,
    TrackingCredentials,
    UserError,
    check_tracking_access,
    console,
    err_console,
    exit_on_user_error,
    fail,
    titled_table,
)

if TYPE_CHECKING:
    from cluster.storage import SweepLocation
    from hpo.spec import SweepSpec
    from hpo.trials import TrialRow

app = typer.Typer(
    name="hpo",
    help="foxhunt-hpo: hyperparameter sweeps of trading models in f32 and bf16.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
__all__ = ["UserError", "app", "main"]


def main() -> None:
    # MLflow draws a progress bar per artifact it downloads (hpo compare: one per trial
    # on a remote store) into hpo's own output; an explicit value is kept.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    exit_on_user_error(app)


@app.command("models")
def models_cmd(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Families to show: names or 'package.module:ATTR' (default: all)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List the model families with their search spaces (their adapters): the registered
    ones, those installed packages register, or the ones named."""
    from models import FamilyError, all_families, get_family
    from models.base import describe_dim

    try:
        families = [get_family(n) for n in names] if names else all_families()
    except FamilyError as exc:
        fail(str(exc))
    if as_json:
        payload = [
            {
                "name": f.name,
                "kind": f.kind,
                "paper": f.paper,
                "keeps_f32": f.keeps_f32,
                "search_space": {k: describe_dim(d) for k, d in f.search_space.items()},
                "shape_settings": sorted(f.shape_settings),
                "fuses": f.fuses,
                "fuses_on_cpu": f.fuses and f.fuse_on_cpu,
            }
            for f in families
        ]
        console.print_json(json.dumps(payload))
        return
    for family in families:
        title = f"{family.name} ({family.kind}) — {family.paper}"
        table = titled_table(title, "hyperparameter", "range", "default", "shape")
        defaults = family.default_config()
        for key, dim in family.search_space.items():
            shape = "yes" if key in family.shape_settings else ""
            table.add_row(key, describe_dim(dim), repr(getattr(defaults, key, "—")), shape)
        console.print(table)
        console.print(f"  [dim]kept in f32 under bf16:[/] {family.keeps_f32}")
        fused = (
            "no (rl: its environments and replay have no member dimension)"
            if not family.fuses
            else "yes"
            + ("" if family.fuse_on_cpu else " (on a GPU; unfused on a CPU, where it is slower)")
        )
        console.print(f"  [dim]folds train fused:[/] {fused}\n")


@app.command("train")
def train_cmd(
    model: Annotated[str | None, typer.Option(help="Model family (see `hpo models`).")] = None,
    precision: Annotated[
        str | None, typer.Option(help="f32, bf16, bf16-mixed, fp16-mixed or auto.")
    ] = None,
    epochs: Annotated[int | None, typer.Option(help="Epochs (on resume: the new total).")] = None,
    data: Annotated[
        str, typer.Option(help="'synthetic' or a CSV/Parquet file or directory.")
    ] = "synthetic",
    seed: Annotated[int, typer.Option(help="Trial seed.")] = 0,
    set_: Assignments = None,
    out: Annotated[
        Path | None, typer.Option(help="Run directory for checkpoints and metrics.json.")
    ] = None,
    resume: Annotated[
        str | None,
        typer.Option(
            help="Continue from a run dir or checkpoint dir's newest good checkpoint "
            "(a path, or an object-store URI as `hpo best` prints it)."
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(help="auto, cpu or cuda[:N] (default: auto; on resume: the run's own)."),
    ] = None,
) -> None:
    """Train one trial in-process (no Ray) and write its checkpoints under --out."""
    from trainables.checkpoint import CheckpointError
    from trainables.config import DataConfig, build_train_config, parse_assignments
    from trainables.local import train_local

    config = None
    if resume is None:
        if model is None or out is None:
            fail("hpo train needs --model and --out (or --resume DIR)")
        try:
            config = build_train_config(
                model,
                parse_assignments(set_ or []),
                data=DataConfig(source=data),
                precision=precision or "f32",
                epochs=epochs or 10,
                seed=seed,
                device=device or "auto",
            )
        except (ValueError, TypeError) as exc:
            fail(str(exc))
    elif set_:
        fail(
            "--set cannot change a resumed trial's settings (only --precision, --epochs and --device)"
        )
    elif is_uri(resume) and out is None:
        fail(
            "--out is required when resuming from a URI (the checkpoint is fetched to a temporary copy)"
        )

    progress = _EpochPrinter()
    try:
        with _local_checkpoint(resume) as local_resume:
            run = train_local(
                config,
                out,
                resume=local_resume,
                precision=precision if resume is not None else None,
                epochs=epochs if resume is not None else None,
                device=device if resume is not None else None,
                on_epoch=progress.on_epoch,
                on_start=progress.on_start,
            )
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    for skipped in run.skipped_checkpoints:
        err_console.print(f"[yellow]skipped a bad checkpoint:[/] {skipped}")
    _print_summary(run.final, title=f"final metrics ({run.precision})")
    if run.fell_back_to_f32:
        console.print(
            "[yellow]this trial fell back from bf16 to f32 after repeated non-finite steps[/]"
        )
    console.print(
        f"checkpoints: {run.out_dir / 'checkpoints'}   metrics: {run.out_dir / 'metrics.json'}"
    )


@app.command("predict")
def predict_cmd(
    checkpoint: Annotated[
        str,
        typer.Option(help="Run dir, checkpoints dir or one checkpoint dir (a path or a URI)."),
    ],
    data: Annotated[
        str, typer.Option(help="CSV/Parquet bars (same assets as training), or 'synthetic'.")
    ],
    out: Annotated[Path, typer.Option(help="CSV of positions (timestamp, asset, position).")],
    policy: Annotated[
        str, typer.Option(help="Precision policy to run in; auto = bf16 on Ampere+, else f32.")
    ] = "auto",
    old_precision: Annotated[
        str | None, typer.Option("--precision", hidden=True, help="The old name of --policy.")
    ] = None,
) -> None:
    """Positions for new bars from a checkpoint, plus the backtest of those bars."""
    if old_precision is not None:
        console.print("[yellow]--precision is now --policy (the policy it runs in)[/]")
        policy = old_precision
    from trainables.checkpoint import CheckpointError
    from trainables.data import OHLCVError
    from trainables.predict import predict

    try:
        with _local_checkpoint(checkpoint) as local:
            assert local is not None
            prediction = predict(local, data, policy=policy)
    except (CheckpointError, OHLCVError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    prediction.write_csv(out)
    summary = prediction.backtest.to_dict()
    summary_path = out.with_suffix(".backtest.json")
    summary_path.write_text(json.dumps(summary, indent=1))
    _print_summary(summary, title="backtest of the new bars")
    console.print(
        f"{len(prediction.timestamps)} bars x {len(prediction.assets)} assets -> {out} "
        f"(ran in {prediction.policy}; checkpoint {prediction.checkpoint})"
    )


@app.command("sweep")
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
            help="Print the GPU packing plan (profiled on the GPU nodes) and exit without "
            "launching: no sweep directory, no MLflow run.",
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
    from dashboards.report import render_report
    from hpo.record import SweepError
    from hpo.sweep import plan_only, run_sweep

    spec = _load_sweep_spec(spec_path, storage, tracking_uri, name, compare)
    if num_gpus is not None and address is not None:
        fail("--num-gpus sets up a local Ray; a cluster at --address declares its own GPUs")
    if plan:
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
    scheduler = "asha per member" if spec.asha_per_member else spec.scheduler
    console.print(
        f"sweep [bold]{spec.name}[/]: {spec.n_trials} trials{grouped} ({', '.join(spec.models)} "
        f"x {', '.join(spec.precisions)}; {spec.search} + {scheduler}), MLflow at "
        f"{spec.tracking_uri}"
    )
    try:
        rows = run_sweep(
            spec,
            address=address,
            on_event=_print_event,
            num_gpus=num_gpus,
            render_report=render_report,
        )
    except SweepError as exc:
        fail(str(exc))
    _print_sweep_result(rows, spec.n_trials, _sweep_dir(spec.storage, spec.name), spec.tracking_uri)
    _exit_if_interrupted(rows, spec.n_trials)


@app.command("resume")
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
    from dashboards.report import render_report
    from hpo.record import SweepError, SweepRecord
    from hpo.sweep import resume_sweep

    try:
        record = SweepRecord.read(sweep_dir)
        check_tracking_access(record.tracking_uri, tracking_credentials)
        console.print(f"resuming sweep [bold]{record.spec.name}[/] in {record.sweep_dir}")
        rows = resume_sweep(
            sweep_dir, address=address, on_event=_print_event, render_report=render_report
        )
    except SweepError as exc:
        fail(str(exc))
    _print_sweep_result(rows, record.spec.n_trials, record.sweep_dir, record.tracking_uri)
    _exit_if_interrupted(rows, record.spec.n_trials)


@app.command("status")
def status_cmd(
    sweep_dir: SweepDirArg,
    as_json: JsonFlag = False,
    tracking_credentials: TrackingCredentials = None,
) -> None:
    """Where a sweep stands: every trial's status, epochs and validation Sharpe."""
    from hpo.record import SweepError, SweepRecord
    from hpo.trials import latest_attempts, spent_hours, trial_rows

    try:
        record = SweepRecord.read(sweep_dir, check_data=False)
    except SweepError as exc:
        fail(str(exc))
    attempts = trial_rows(record.sweep_dir, retried=True)
    rows = latest_attempts(attempts)
    spent = spent_hours(attempts)
    if as_json:
        payload = {
            "planned": record.spec.n_trials,
            "trials": [r.to_dict() for r in rows],
            "spent": spent,
        }
        console.print_json(json.dumps(payload, default=str))
        return
    title = f"{record.spec.name}: {len(rows)} of {record.spec.n_trials} trials started"
    columns = ("trial", "model", "precision", "seed", "pair", "status", "epochs", "val Sharpe")
    table = titled_table(title, *columns, "note")
    for r in rows:
        note = "diverged" if r.diverged else "fell back to f32" if r.fell_back_to_f32 else ""
        table.add_row(
            r.trial_id,
            r.model,
            r.precision,
            str(r.seed),
            r.pair_id,
            r.status,
            str(r.epochs),
            _num(r.val_sharpe),
            note,
        )
    console.print(table)
    console.print(_spent_line(spent))
    _print_links(record.tracking_uri, record.sweep_dir)


@app.command("best")
def best_cmd(
    sweep_dir: SweepDirArg,
    model: Annotated[str | None, typer.Option(help="Only this model family.")] = None,
    precision: Annotated[str | None, typer.Option(help="Only this precision.")] = None,
    as_json: JsonFlag = False,
    tracking_credentials: TrackingCredentials = None,
) -> None:
    """The best trial per model and precision, with the checkpoint `hpo train --resume` takes."""
    from hpo.record import SweepError, SweepRecord
    from hpo.trials import best_rows, trial_rows

    try:
        record = SweepRecord.read(sweep_dir, check_data=False)
    except SweepError as exc:
        fail(str(exc))
    best = best_rows(trial_rows(record.sweep_dir), model=model, precision=precision)
    if as_json:
        console.print_json(json.dumps([r.to_dict() for r in best], default=str))
        return
    if not best:
        fail("no finished trial with a validation Sharpe matches")
    _print_best(best)
    console.print(
        "continue one alone: hpo train --resume CHECKPOINT --out DIR [--precision f32] [--epochs N]"
    )


def _register_ensemble() -> None:
    # The command's body lives in hpo/cli_ensemble.py; its options are declared there.
    from hpo.cli_ensemble import ensemble_cmd

    app.command("ensemble")(ensemble_cmd)


_register_ensemble()


@app.command("compare")
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


@app.command("check-family")
def check_family_cmd(
    reference: Annotated[
        str, typer.Argument(help="A family: a registered name or 'package.module:ATTR'.")
    ],
    policies: Annotated[
        list[str] | None,
        typer.Option("--policy", help="Policies to check (repeatable; default: all four)."),
    ] = None,
    learning: Annotated[
        bool,
        typer.Option(help="Train it on the planted synthetic signal (about a minute)."),
    ] = True,
    as_json: JsonFlag = False,
) -> None:
    """Check a model family against the contract the ten built-in families pass: its
    records, dtypes and outputs under every precision policy, a finite run, a bit-exact
    checkpoint round trip and resume, a step that reads nothing on the host, learning
    the planted signal, and fused folds (or why not). Exit 1 when a check fails."""
    from trainables.contract import DEFAULT_LEARNING, POLICIES, run_checks

    def progress(result: Any) -> None:
        if not as_json:
            mark = "[green]ok[/]" if result.passed else "[red]FAILED[/]"
            console.print(f"{mark} {escape(result.name)}: {escape(result.detail)}")

    results = run_checks(
        reference,
        policies=tuple(policies or POLICIES),
        learning=DEFAULT_LEARNING if learning else None,
        on_result=progress,
    )
    failed = [r for r in results if not r.passed]
    if as_json:
        console.print_json(json.dumps([r.__dict__ for r in results]))
    else:
        table = titled_table(f"family contract: {reference}", "check", "holds", "detail")
        for r in results:
            table.add_row(r.name, "yes" if r.passed else "NO", escape(r.detail))
        console.print(table)
        verdict = "breaks the contract" if failed else "meets the contract"
        console.print(f"{reference} {verdict} ({len(results) - len(failed)}/{len(results)})")
    if failed:
        raise typer.Exit(1)


@app.command("profile")
def profile_cmd(
    model: Annotated[str | None, typer.Option(help="Model family (see `hpo models`).")] = None,
    precision: Annotated[
        str, typer.Option(help="f32, bf16, bf16-mixed, fp16-mixed or auto.")
    ] = "f32",
    batch_size: Annotated[
        int | None, typer.Option(help="Trainer minibatch size (default: the trainer's).")
    ] = None,
    set_: Assignments = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Every family in f32 and bf16, with bf16/f32 ratios.")
    ] = False,
    headroom: Annotated[
        float, typer.Option(help="Share of the peak kept free (the spec's resources.headroom).")
    ] = 0.15,
    estimate: Annotated[
        bool, typer.Option("--estimate", help="Estimate from tensor bytes even where CUDA is.")
    ] = False,
    refresh: Annotated[
        bool, typer.Option("--refresh", help="Profile again instead of reading the VRAM table.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """A trial's GPU memory by component (measured on CUDA, estimated without), the GPU
    fraction it packs at and the trials per GPU that implies."""
    from cluster.packing_plan import ShapeRequest, family_plans, shape_plan
    from trainables.config import parse_assignments

    if all_ == (model is not None):
        fail("hpo profile needs --model NAME or --all")
    try:
        overrides = parse_assignments(set_ or [])
    except ValueError as exc:
        fail(str(exc))
    request = ShapeRequest(
        overrides=overrides,
        batch_size=batch_size,
        headroom=headroom,
        mode="estimate" if estimate else None,
        refresh=refresh,
    )
    if model is None:
        plans = family_plans(request)
        if as_json:
            console.print_json(json.dumps(plans.to_dict()))
        else:
            _print_family_plans(plans.rows, plans.skipped, headroom)
        return
    try:
        profile, packing = shape_plan(model, precision, request)
    except (ValueError, TypeError, RuntimeError) as exc:
        fail(str(exc))
    if as_json:
        console.print_json(json.dumps({"profile": profile.to_dict(), "packing": packing.to_dict()}))
        return
    how = (
        f"measured on {profile.device_name}"
        if profile.method == "measured"
        else f"estimated from tensor bytes ({profile.device_name})"
    )
    table = titled_table(
        f"{profile.model} / {profile.precision}: {how}; {profile.n_params:,} "
        f"parameters per fold, {profile.n_folds} fold(s)",
        *("component", "MiB"),
        right={"MiB"},
    )
    for name, value in profile.components().items():
        table.add_row(name, _mib(value))
    table.add_row("estimated peak (no context)", _mib(profile.estimated_peak_bytes))
    if profile.measured_allocated_bytes is not None:
        table.add_row("measured max allocated", _mib(profile.measured_allocated_bytes))
        table.add_row("measured max reserved", _mib(profile.measured_reserved_bytes))
    console.print(table)
    error = profile.estimate_error
    if error is not None:
        console.print(f"estimate vs measured allocated: {error:+.1%}")
    console.print(
        f"peak {_mib(profile.peak_bytes)} MiB x (1 + {headroom:g}) + context "
        f"{_mib(profile.context_bytes)} MiB of {packing.device_total_bytes / 2**30:.1f} GiB "
        f"= {packing.raw_fraction:.4f} -> GPU fraction [bold]{packing.fraction:g}[/] "
        f"(rounded at Ray's {1 / packing.grid:g}): [bold]{packing.trials_per_gpu}[/] trials per GPU "
        f"({packing.trials_per_gpu_unrounded} by memory alone)"
    )


def _mib(n: float | None) -> str:
    return "—" if n is None else f"{n / 2**20:,.1f}"


def _print_family_plans(rows: list[dict[str, Any]], skipped: list[str], headroom: float) -> None:
    first = rows[0]["f32"]["profile"] if rows else None
    where = f"{first['method']}, {first['device_name']}" if first else "no family profiled"
    numbers = (
        "params",
        "f32 peak",
        "bf16 peak",
        "bf16/f32",
        "context",
        "f32 frac",
        "bf16 frac",
        "trials/GPU f32",
        "bf16",
        "by memory f32",
        "bf16",
    )
    table = titled_table(
        f"GPU memory per trial, f32 vs bf16 ({where}; headroom {headroom:g}); MiB",
        *("model", *numbers),
        right=numbers,
    )
    for row in rows:
        f, b = row["f32"], row["bf16"]
        table.add_row(
            row["model"],
            f"{f['profile']['n_params']:,}",
            _mib(f["profile"]["peak_bytes"]),
            _mib(b["profile"]["peak_bytes"]),
            f"{row['bf16_over_f32_peak']:.2f}",
            _mib(f["profile"]["context_bytes"]),
            f"{f['packing']['fraction']:g}",
            f"{b['packing']['fraction']:g}",
            str(f["packing"]["trials_per_gpu"]),
            str(b["packing"]["trials_per_gpu"]),
            str(f["packing"]["trials_per_gpu_unrounded"]),
            str(b["packing"]["trials_per_gpu_unrounded"]),
        )
    console.print(table)
    for line in skipped:
        console.print(f"[yellow]skipped[/] {escape(line)}")


@app.command("submit")
def submit_cmd(
    spec_path: SpecArg,
    address: JobsAddress = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Stream the job's logs; exit with its status.")
    ] = False,
    name: NameOption = None,
    tracking_uri: Annotated[
        str | None,
        typer.Option(help="MLflow tracking URI, as seen from the head (e.g. http://mlflow:5000)."),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(help="Results and checkpoints root every node sees (overrides the spec)."),
    ] = None,
    shared_storage: Annotated[
        bool,
        typer.Option(
            "--shared-storage",
            help="Declare --storage shared by every node when its mount does not show it "
            "(sets HPO_SHARED_STORAGE=1 for the job).",
        ),
    ] = False,
    compare: CompareFlag = False,
    working_dir: Annotated[
        Path, typer.Option(help="Project directory uploaded with the job.")
    ] = Path("."),
    python: Annotated[
        str, typer.Option(help="Python on the cluster that runs `-m hpo.cli sweep`.")
    ] = "python",
    check_resources: Annotated[
        bool,
        typer.Option(
            "--check-resources/--no-check-resources",
            help="Refuse a spec no current node can run (turn off for autoscaling clusters "
            "whose GPU workers are scaled to zero; the sweep still checks on the cluster).",
        ),
    ] = True,
    tracking_credentials: TrackingCredentials = None,
    head_credentials: Annotated[
        str | None,
        typer.Option(
            "--head-credentials",
            metavar="PATH",
            help="MLflow credentials file on the head (absolute, or '~/...' quoted so this "
            "shell leaves it to the head) for the job's sweep; the path travels, never the "
            "password (default: the head's MLFLOW_TRACKING_* variables).",
        ),
    ] = None,
) -> None:
    """Submit a sweep to a Ray cluster through the Jobs API (the working directory and
    the spec travel with it); prints the job id, with --follow streams its logs."""
    from cluster.connect import ClusterError
    from cluster.submit import follow_job, job_client, jobs_address, resolve_token, submit_sweep
    from cluster.tracking_auth import PASSWORD_VAR, USERNAME_VAR, is_server_uri

    spec = _load_sweep_spec(spec_path, storage, tracking_uri, name, compare)
    # The URI is the head's view; where this client sees the same server, a refused login
    # fails here, and the job's sweep checks again on the head before launching trials.
    # Without credentials of its own, the client checks with the head's file where it can
    # read it (submitting on the head itself).
    check_with = tracking_credentials
    if check_with is None and head_credentials and not os.environ.get(USERNAME_VAR):
        on_head = Path(head_credentials).expanduser()
        check_with = on_head if on_head.is_file() else None
    if not check_tracking_access(spec.tracking_uri, check_with, timeout_s=3.0):
        err_console.print(
            f"note: {spec.tracking_uri} does not answer from here; the job checks it on the head",
            highlight=False,
            soft_wrap=True,
        )
    # No MLflow secret travels through Ray (its runtime_env is logged on every node): the
    # job's sweep logs in with the head's variables or the file --head-credentials names.
    client_password = os.environ.get(PASSWORD_VAR, "")
    if os.environ.get(USERNAME_VAR) and not head_credentials and is_server_uri(spec.tracking_uri):
        err_console.print(
            "note: the job's sweep logs in to MLflow with the head's MLFLOW_TRACKING_* "
            "variables (credentials are never sent); --head-credentials PATH names a file "
            "on the head instead",
            highlight=False,
            soft_wrap=True,
        )
    import logging

    # Ray logs every file it skips while packaging the snapshot; keep the upload line only.
    logging.getLogger("ray._private.runtime_env.packaging").setLevel(logging.WARNING)
    token = resolve_token()
    try:
        url = jobs_address(address)
        client = job_client(url, token)
        submission = submit_sweep(
            spec,
            url,
            working_dir=working_dir,
            shared_storage=shared_storage,
            python=python,
            check_resources=check_resources,
            token=token,
            client=client,
            head_credentials=head_credentials,
        )
    except ClusterError as exc:
        fail(str(exc))
    console.print(f"submitted job: {submission.job_id}", soft_wrap=True, highlight=False)
    console.print(
        f"sweep [bold]{spec.name}[/]: {spec.n_trials} trials -> {submission.sweep_dir}; "
        f"MLflow at {submission.tracking_uri}",
        soft_wrap=True,
    )
    if not follow:
        console.print(
            f"follow: ray job logs -f {submission.job_id} --address {url}   "
            f"list: hpo jobs --address {url}   stop: ray job stop {submission.job_id} --address {url}",
            soft_wrap=True,
            highlight=False,
        )
        return
    try:
        status = follow_job(
            client,
            submission.job_id,
            lambda text: print(text, end="", flush=True),
            [token or "", client_password],
        )
    except KeyboardInterrupt:
        err_console.print(
            f"stopped following; job {submission.job_id} keeps running "
            f"(ray job stop {submission.job_id} --address {url} ends it)"
        )
        raise typer.Exit(130) from None
    console.print(f"job {submission.job_id}: {status}", highlight=False)
    raise typer.Exit(0 if status == "SUCCEEDED" else 1)


@app.command("jobs")
def jobs_cmd(address: JobsAddress = None, as_json: JsonFlag = False) -> None:
    """List the cluster's jobs (newest first): id, status, sweep, entrypoint, start/end."""
    from cluster.connect import ClusterError
    from cluster.submit import job_client, list_jobs

    try:
        rows = list_jobs(job_client(address))
    except ClusterError as exc:
        fail(str(exc))
    if as_json:
        console.print_json(json.dumps([r.to_dict() for r in rows]))
        return
    columns = ("job", "status", "sweep", "entrypoint", "start", "end", "message")
    table = titled_table(f"{len(rows)} job(s)", *columns, overflow="fold")
    for r in rows:
        table.add_row(r.job_id, r.status, r.sweep, r.entrypoint, r.start, r.end, r.message)
    console.print(table)


@app.command("tracking-server")
def tracking_server_cmd(
    host: Annotated[
        str, typer.Option(help="Interface to bind (loopback unless you say otherwise).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 5000,
    store: Annotated[
        Path,
        typer.Option(
            help="Directory of the SQLite store (mlflow.db), artifacts/ and auth/ (users)."
        ),
    ] = Path("mlflow-server"),
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            help="Host headers clients send, as comma-separated patterns on host:port "
            "(e.g. 'mlflow:*,mlflow.*'); MLflow refuses others. Default: localhost and "
            "private IPs; loopback stays allowed either way."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Server worker processes.")] = 1,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="No authentication: anyone who reaches the port reads and rewrites every "
            "run. Allowed only with a loopback --host.",
        ),
    ] = False,
    add_reader: Annotated[
        str | None,
        typer.Option(
            "--add-reader",
            metavar="NAME",
            help="Add a read-only user NAME (search and view runs; no writes), write its "
            "credentials file under STORE/auth/ (mode 0600), print its path and exit. Works "
            "while the server runs.",
        ),
    ] = None,
    sweep_credentials: Annotated[
        Path | None,
        typer.Option(
            "--sweep-credentials",
            help="Take the sweep user's name and password from this credentials file (or "
            "Kubernetes Secret directory) instead of generating them.",
        ),
    ] = None,
) -> None:
    """Run an MLflow tracking server (SQLite + served artifacts, MLflow's authentication
    on) until Ctrl+C."""
    import signal
    import time

    from cluster.tracking_server import (
        TrackingServerError,
        is_loopback,
        start_tracking_server,
    )

    if add_reader is not None:
        if no_auth:
            fail("--add-reader adds a user of the authenticated server: drop --no-auth")
        from cluster.tracking_users import TrackingAuthSetupError
        from cluster.tracking_users import add_reader as add_reader_user

        try:
            path = add_reader_user(store, add_reader)
        except (TrackingAuthSetupError, ValueError) as exc:
            fail(str(exc))
        console.print(
            f"read-only user {add_reader!r}: credentials in {path} (mode 0600). Hand them over "
            "privately; the browser asks for them when the UI opens.",
            highlight=False,
            soft_wrap=True,
        )
        return
    if no_auth and not is_loopback(host):
        fail(
            f"--no-auth with --host {host}: a server without authentication may listen on "
            "loopback (127.0.0.1) only; drop --no-auth to serve the network with MLflow's "
            "authentication"
        )
    if no_auth:
        err_console.print(
            f"[yellow]warning:[/] authentication is off (--no-auth): allowed because {host} "
            "is loopback; anyone on this machine can read and write the store"
        )
    elif not is_loopback(host):
        err_console.print(
            f"[yellow]note:[/] binding to {host}: clients need the sweep user's credentials; "
            "pass --allowed-hosts for the names clients use"
        )
    try:
        server = start_tracking_server(
            store,
            host=host,
            port=port,
            workers=workers,
            allowed_hosts=allowed_hosts,
            auth=not no_auth,
            sweep_credentials=sweep_credentials,
        )
    except TrackingServerError as exc:
        fail(str(exc))
    console.print(f"tracking URI: {server.uri}", highlight=False, soft_wrap=True)
    if server.credentials_path is not None:
        console.print(
            f"authentication: on; sweep user's credentials in {server.credentials_path} "
            "(mode 0600): `--tracking-credentials FILE`, or MLFLOW_TRACKING_USERNAME / "
            "MLFLOW_TRACKING_PASSWORD from it; read-only users: --add-reader NAME",
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"store {server.backend_store_uri}, artifacts {server.artifacts_dir}; UI at {server.uri}; "
        f"sweeps: --tracking-uri {server.uri}. Ctrl+C stops it.",
        highlight=False,
        soft_wrap=True,
    )

    def _stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        while server.process.poll() is None:
            time.sleep(0.5)
        err_console.print(f"mlflow server exited with code {server.process.returncode}")
        raise typer.Exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    console.print("tracking server stopped")


EXIT_INTERRUPTED = 3


def _print_event(line: str) -> None:
    """A sweep's progress line or plan, as it is (no rich markup in trial names or tables)."""
    console.print(line, markup=False, highlight=False)


def _exit_if_interrupted(rows: list[TrialRow], planned: int) -> None:
    """A sweep that stopped before every planned trial ended exits 3 (resumable)."""
    if sum(r.done for r in rows) < planned:
        raise typer.Exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def _local_checkpoint(where: str | None) -> Iterator[Path | None]:
    """A checkpoint argument as a local directory: an object-store URI is fetched into a
    temporary copy for the command's duration."""
    from cluster.storage import local_copy

    if where is None:
        yield None
        return
    with contextlib.ExitStack() as stack:
        try:
            local = stack.enter_context(local_copy(where))
        except OSError as exc:  # pyarrow's network and permission errors are OSErrors
            fail(f"cannot fetch the checkpoint {where}: {exc}")
        if is_uri(where):
            err_console.print(f"fetched {escape(where)} to {local}")
        yield local


def _load_sweep_spec(
    spec_path: Path, storage: str | None, tracking_uri: str | None, name: str | None, compare: bool
) -> SweepSpec:
    """The spec file with the command line's overrides (`--compare` implies FIFO: paired
    trials must all finish)."""
    from hpo.spec import SpecError, load_spec

    overrides: dict[str, Any] = {"storage": storage, "tracking_uri": tracking_uri, "name": name}
    if compare:
        overrides.update(compare=True, scheduler="fifo")
    try:
        return load_spec(spec_path, overrides)
    except SpecError as exc:
        fail(str(exc))


def _sweep_dir(storage: str, name: str) -> SweepLocation:
    from cluster.storage import SweepLocation

    return SweepLocation.parse(storage).child(name)


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:+.3f}"


def _print_best(best: list[Any]) -> None:
    table = titled_table(
        "best trial per model and precision (final validation Sharpe)",
        *("model", "precision", "val Sharpe", "test Sharpe", "trial", "config", "checkpoint"),
        overflow="fold",
    )
    for r in best:
        config = ", ".join(f"{k}={_short(v)}" for k, v in sorted(r.params.items()))
        table.add_row(
            r.model,
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


def _print_sweep_result(
    rows: list[TrialRow], planned: int, sweep_dir: SweepLocation, tracking_uri: str
) -> None:
    from hpo.trials import best_rows

    done = sum(r.done for r in rows)
    diverged = sum(r.diverged for r in rows)
    fell_back = sum(r.fell_back_to_f32 for r in rows)
    console.print(
        f"{done}/{planned} trials finished ({len(rows) - done} not finished; {diverged} diverged, "
        f"{fell_back} fell back to f32) in {sweep_dir}"
    )
    best = best_rows(rows)
    if best:
        _print_best(best)
    if done < planned:
        console.print(f"[yellow]interrupted: continue with[/] hpo resume {sweep_dir}")
    _print_links(tracking_uri, sweep_dir)


class _EpochPrinter:
    """One line per epoch: the trainer reports epochs, never individual steps."""

    def on_start(self, trainer: Any) -> None:
        cfg = trainer.config
        where = f"resuming at epoch {trainer.epoch}" if trainer.epoch else "starting"
        console.print(
            f"[bold]{cfg.family}[/] {where}: policy {trainer.policy.name}, device {trainer.device}, "
            f"{len(trainer.folds)} fold(s), {cfg.epochs} epochs"
        )

    def on_epoch(self, trainer: Any, metrics: dict[str, Any]) -> None:
        console.print(
            f"epoch {metrics['epoch']:>3}/{trainer.config.epochs}  loss {metrics['train_loss']:.4f}  "
            f"val Sharpe {metrics['val_sharpe']:+.2f}  skipped {metrics['skipped_steps']}  "
            f"{metrics['steps_per_s']:.0f} steps/s  {metrics['epoch_time_s']:.1f}s"
        )


def _print_summary(metrics: dict[str, Any], title: str) -> None:
    table = titled_table(title, "metric", "value", right={"value"})
    for key, value in metrics.items():
        if isinstance(value, float):
            table.add_row(key, f"{value:.4f}")
        else:
            table.add_row(key, str(value))
    console.print(table)


if __name__ == "__main__":
    main()

"""``hpo`` commands for work on this machine, without Ray: the families
(``hpo families``, ``hpo check-family``), one trial (``hpo train``), serving a checkpoint
(``hpo predict``) and a trial's GPU memory (``hpo profile``).

    hpo families                                       families and their search spaces
    hpo train --family tft --precision bf16 --out runs/tft-bf16 [--epochs 5] [--set lr=3e-4]
    hpo train --resume runs/tft-bf16 [--precision f32] [--epochs 8] [--device cpu]
    hpo predict --checkpoint runs/tft-bf16 --data bars.csv --out positions.csv
    hpo profile --family tft --precision bf16           (or --all)
    hpo check-family desk_gru:FAMILY [--no-learning]

Each command parses its flags, calls ``trainables`` / ``cluster`` and prints; torch is
imported inside the commands.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from cluster.storage import is_uri
from hpo.cli._options import (
    Assignments,
    JsonFlag,
    console,
    err_console,
    fail,
    titled_table,
)


def families_cmd(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Families to show: names or 'package.module:ATTR' (default: all)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List the families with their search spaces (their adapters): the registered
    ones, those installed packages register, or the ones named."""
    from models import FamilyError, all_families, get_family
    from models.family import describe_dim

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
            "no (rl: its environments and replay have no slot dimension)"
            if not family.fuses
            else "yes"
            + ("" if family.fuse_on_cpu else " (on a GPU; unfused on a CPU, where it is slower)")
        )
        console.print(f"  [dim]folds train fused:[/] {fused}\n")


def train_cmd(
    family: Annotated[str | None, typer.Option(help="Family (see `hpo families`).")] = None,
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
        if family is None or out is None:
            fail("hpo train needs --family and --out (or --resume DIR)")
        try:
            config = build_train_config(
                family,
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


def predict_cmd(
    checkpoint: Annotated[
        str,
        typer.Option(help="Run dir, checkpoints dir or one checkpoint dir (a path or a URI)."),
    ],
    data: Annotated[
        str, typer.Option(help="CSV/Parquet bars (same assets as training), or 'synthetic'.")
    ],
    out: Annotated[Path, typer.Option(help="CSV of positions (timestamp, asset, position).")],
    precision: Annotated[
        str, typer.Option(help="Precision to run in; auto = bf16 on Ampere+, else f32.")
    ] = "auto",
) -> None:
    """Positions for new bars from a checkpoint, plus the backtest of those bars."""
    from trainables.checkpoint import CheckpointError
    from trainables.data import OHLCVError
    from trainables.predict import predict

    try:
        with _local_checkpoint(checkpoint) as local:
            assert local is not None
            prediction = predict(local, data, precision=precision)
    except (CheckpointError, OHLCVError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    prediction.write_csv(out)
    summary = prediction.backtest.to_dict()
    summary_path = out.with_suffix(".backtest.json")
    summary_path.write_text(json.dumps(summary, indent=1))
    _print_summary(summary, title="backtest of the new bars")
    console.print(
        f"{len(prediction.timestamps)} bars x {len(prediction.assets)} assets -> {out} "
        f"(ran in {prediction.precision}; checkpoint {prediction.checkpoint})"
    )


def check_family_cmd(
    reference: Annotated[
        str, typer.Argument(help="A family: a registered name or 'package.module:ATTR'.")
    ],
    precisions: Annotated[
        list[str] | None,
        typer.Option("--precision", help="Precisions to check (repeatable; default: all four)."),
    ] = None,
    learning: Annotated[
        bool,
        typer.Option(help="Train it on the planted synthetic signal (about a minute)."),
    ] = True,
    as_json: JsonFlag = False,
) -> None:
    """Check a family against the contract the ten built-in families pass: its
    records, dtypes and outputs under every precision, a finite run, a bit-exact
    checkpoint round trip and resume, a step that reads nothing on the host, learning
    the planted signal, and fused folds (or why not). Exit 1 when a check fails."""
    from trainables.contract import DEFAULT_LEARNING, PRECISIONS, run_checks

    def progress(result: Any) -> None:
        if not as_json:
            mark = "[green]ok[/]" if result.passed else "[red]FAILED[/]"
            console.print(f"{mark} {escape(result.name)}: {escape(result.detail)}")

    results = run_checks(
        reference,
        precisions=tuple(precisions or PRECISIONS),
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


def profile_cmd(
    family: Annotated[str | None, typer.Option(help="Family (see `hpo families`).")] = None,
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

    if all_ == (family is not None):
        fail("hpo profile needs --family NAME or --all")
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
    if family is None:
        plans = family_plans(request)
        if as_json:
            console.print_json(json.dumps(plans.to_dict()))
        else:
            _print_family_plans(plans.rows, plans.skipped, headroom)
        return
    try:
        profile, packing = shape_plan(family, precision, request)
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
        f"{profile.family} / {profile.precision}: {how}; {profile.n_params:,} "
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
        *("family", *numbers),
        right=numbers,
    )
    for row in rows:
        f, b = row["f32"], row["bf16"]
        table.add_row(
            row["family"],
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


class _EpochPrinter:
    """One line per epoch: the trainer reports epochs, never individual steps."""

    def on_start(self, trainer: Any) -> None:
        cfg = trainer.config
        where = f"resuming at epoch {trainer.epoch}" if trainer.epoch else "starting"
        console.print(
            f"[bold]{cfg.family}[/] {where}: precision {trainer.policy.name}, device {trainer.device}, "
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

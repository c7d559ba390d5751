"""Where a command's CPU time goes, by kind of process: the pytest workers, the trial
actors, the `hpo` commands the end-to-end tests run, Ray's and MLflow's own processes,
the set-up's tools, and the kernel's threads.

    python3 bench/cpu_by_process.py -- env CI=true bash .ci/run
    python3 bench/cpu_by_process.py --json cpu.json --kind grpc=grpc_fork -- make test

(the standard library alone: it runs before the set-up makes a venv).

It samples every process on the machine (``/proc/<pid>/stat``) every ``--every`` seconds
while the command runs, keeps each one's CPU time since the command started (a process
already running then counts from there), names each by its command line, and prints
CPU-s per kind beside the machine's busy and idle CPU-s (``/proc/stat``) over the same
span. A process that starts and ends between two samples is not seen, and one that ends
loses its last interval; the line "the sampler saw" says how much that left out. The
whole machine is sampled, not the command's descendants: a Ray worker is the raylet's
child, not the test's, and the kernel's threads work for the command too (a fresh
clone's `make test` on the first-generation EPYC: bench/README.md, "Where the test
suite's time goes", fourteenth session). Linux only. Exits with the command's status.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# execnet's bootstrap: what a pytest-xdist worker's command line is.
XDIST_WORKER = "import sys;exec(eval(sys.stdin.readline()))"

Rule = Callable[[str, str], bool]
IDLE_RAY_WORKERS = "idle Ray workers"

# First match wins. A Ray worker renames itself (its command line becomes its title:
# ``ray::IDLE``, then ``ray::ImplicitFunc.train`` once it holds a Tune trial).
RULES: tuple[tuple[str, Rule], ...] = (
    ("trial actors (ray::ImplicitFunc)", lambda comm, cmd: cmd.startswith("ray::ImplicitFunc")),
    ("profile tasks (ray::hpo-profile)", lambda comm, cmd: cmd.startswith("ray::hpo-profile")),
    (
        "Ray's dashboard and runtime-env agents",
        lambda comm, cmd: cmd.startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent")),
    ),
    (
        IDLE_RAY_WORKERS,
        lambda comm, cmd: cmd.startswith("ray::IDLE") or "ray/_private/workers/" in cmd,
    ),
    ("other Ray tasks and actors", lambda comm, cmd: cmd.startswith("ray::")),
    (
        "Ray's own processes (raylet, GCS, monitors, `ray start`)",
        lambda comm, cmd: (
            comm in ("raylet", "gcs_server")
            or any(
                part in cmd
                for part in ("ray/_private/", "ray/autoscaler/", "ray/dashboard/", "/bin/ray ")
            )
        ),
    ),
    (
        "MLflow tracking servers",
        lambda comm, cmd: "mlflow server" in cmd or "uvicorn" in cmd or "gunicorn" in cmd,
    ),
    (
        "`hpo` commands",
        lambda comm, cmd: "/bin/hpo " in cmd or "-m hpo.cli" in cmd or "from hpo.cli" in cmd,
    ),
    ("pytest workers (xdist)", lambda comm, cmd: XDIST_WORKER in cmd),
    (
        "pytest (controller, child sessions)",
        lambda comm, cmd: "-m pytest" in cmd or "/bin/pytest" in cmd,
    ),
    ("bench scripts", lambda comm, cmd: "/bench/" in cmd or cmd.startswith("bench/")),
    ("bytecode (compileall)", lambda comm, cmd: "compileall" in cmd),
    ("mypy", lambda comm, cmd: "mypy" in cmd),
    ("ruff", lambda comm, cmd: "ruff" in cmd),
    ("pip", lambda comm, cmd: " pip " in f" {cmd} " or "-m pip" in cmd),
    ("chromium", lambda comm, cmd: "chrom" in comm),
)


def kind_of(comm: str, cmdline: str, extra: Sequence[tuple[str, str]] = ()) -> str:
    """The kind a process counts under: ``extra``'s (label, substring of the command
    line) first, then :data:`RULES`; a kernel thread (no command line) by its name
    without the CPU number (``kworker/1:1H`` is ``kernel thread kworker``); else
    ``other: <name>``."""
    for label, part in extra:
        if part in cmdline:
            return label
    for label, rule in RULES:
        if rule(comm, cmdline):
            return label
    if not cmdline:
        return f"kernel thread {comm.split('/')[0]}"
    return f"other: {comm}"


def better_title(old: str, new: str) -> str:
    """The command line to keep for a process seen as ``old`` and now as ``new``: a Ray
    worker that held a trial or a task keeps that title when it goes back to ``ray::IDLE``
    (or its command line can no longer be read)."""
    held_work = old.startswith("ray::") and not old.startswith("ray::IDLE")
    if held_work and (not new or new.startswith("ray::IDLE")):
        return old
    return new or old


@dataclass
class Seen:
    """One process, as sampled."""

    pid: int
    comm: str
    cmdline: str
    cpu_at_start: float
    cpu: float
    sightings: int = 1

    @property
    def used(self) -> float:
        return max(0.0, self.cpu - self.cpu_at_start)


def may_rename(process: Seen, comm: str) -> bool:
    """Whether ``process``'s command line may have changed since it was read: in its first
    samples (a forked child still shows its parent's until it execs), when its name
    changed, or while it is a Ray worker, which retitles itself for each task or actor.
    Reading only these keeps the sampler at a small share of a core."""
    return (
        process.sightings <= 3
        or comm != process.comm
        or kind_of(process.comm, process.cmdline) == IDLE_RAY_WORKERS
    )


def read_process(pid: str) -> tuple[str, str, float] | None:
    """(key, name, CPU-s) of ``/proc/<pid>``, or None once it is gone. The key adds the
    start time, so a reused pid is another process."""
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    name_end = stat.rindex(")")
    comm = stat[stat.index("(") + 1 : name_end]
    fields = stat[name_end + 2 :].split()
    # Fields after the name, from 0: utime 11, stime 12, starttime 19 (proc(5)).
    cpu = (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    return f"{pid}:{fields[19]}", comm, cpu


def read_cmdline(pid: str) -> str:
    try:
        raw = (PROC / pid / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:400]


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU-s of the whole machine since boot (``/proc/stat``; idle counts
    I/O wait, busy leaves out steal and guests, which other machines' work is)."""
    fields = [int(v) for v in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / TICKS_PER_S, (idle + iowait) / TICKS_PER_S


class Sampler:
    """Every process's CPU time since the sampler started, and its latest command line."""

    def __init__(self) -> None:
        self.seen: dict[str, Seen] = {}
        self.first = True

    def sample(self) -> None:
        for entry in os.listdir(PROC):
            if not entry.isdigit():
                continue
            got = read_process(entry)
            if got is None:
                continue
            key, comm, cpu = got
            known = self.seen.get(key)
            if known is None:
                # A process that was running when sampling began counts from then on.
                start = cpu if self.first else 0.0
                self.seen[key] = Seen(int(entry), comm, read_cmdline(entry), start, cpu)
                continue
            known.cpu = max(known.cpu, cpu)
            known.sightings += 1
            if may_rename(known, comm):
                known.cmdline = better_title(known.cmdline, read_cmdline(entry))
            known.comm = comm
        self.first = False


@dataclass(frozen=True)
class KindTotal:
    kind: str
    cpu_s: float
    processes: int


def totals(seen: Sequence[Seen], extra: Sequence[tuple[str, str]] = ()) -> list[KindTotal]:
    """CPU-s and processes per kind, largest first; processes that used none are left out."""
    by_kind: dict[str, list[float]] = {}
    for process in seen:
        if process.used <= 0:
            continue
        by_kind.setdefault(kind_of(process.comm, process.cmdline, extra), []).append(process.used)
    rows = [KindTotal(k, sum(v), len(v)) for k, v in by_kind.items()]
    return sorted(rows, key=lambda r: (-r.cpu_s, r.kind))


def format_table(rows: Sequence[KindTotal], min_cpu_s: float) -> list[str]:
    total = sum(r.cpu_s for r in rows) or 1.0
    lines = [f"{'CPU-s':>8} {'share':>6} {'processes':>9}  kind"]
    small = [r for r in rows if r.cpu_s < min_cpu_s]
    for r in rows:
        if r.cpu_s >= min_cpu_s:
            lines.append(f"{r.cpu_s:8.1f} {r.cpu_s / total:6.1%} {r.processes:9d}  {r.kind}")
    if small:
        cpu = sum(r.cpu_s for r in small)
        n = sum(r.processes for r in small)
        lines.append(
            f"{cpu:8.1f} {cpu / total:6.1%} {n:9d}  {len(small)} kinds under {min_cpu_s:g} CPU-s"
        )
    return lines


def parse_kind(text: str) -> tuple[str, str]:
    label, sep, part = text.partition("=")
    if not sep or not label or not part:
        raise argparse.ArgumentTypeError(f"--kind wants LABEL=SUBSTRING, got {text!r}")
    return label, part


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--json", type=Path, help="write every process seen here")
    parser.add_argument(
        "--kind",
        type=parse_kind,
        action="append",
        default=[],
        metavar="LABEL=SUBSTRING",
        help="count processes whose command line holds SUBSTRING as LABEL (before the rules)",
    )
    parser.add_argument("--min", type=float, default=3.0, help="fold kinds under this many CPU-s")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    if not (PROC / "stat").is_file():
        parser.error("needs Linux's /proc")

    sampler = Sampler()
    sampler.sample()
    busy0, idle0 = machine_cpu()
    started = time.monotonic()
    process = subprocess.Popen(command)
    me = os.getpid()
    try:
        while process.poll() is None:
            time.sleep(args.every)
            sampler.sample()
    except KeyboardInterrupt:  # the command has its own ^C; wait for it and still report
        process.wait()
    sampler.sample()
    wall = time.monotonic() - started
    busy1, idle1 = machine_cpu()

    seen = [s for s in sampler.seen.values() if s.pid != me]
    rows = totals(seen, args.kind)
    own = next((s.used for s in sampler.seen.values() if s.pid == me), 0.0)
    sampled = sum(r.cpu_s for r in rows)
    shown = shlex.join(command).replace("\n", " ")
    shown = shown if len(shown) <= 100 else shown[:97] + "..."
    print(f"\n{shown}: exit {process.returncode} in {wall:.1f} s")
    print(
        f"the machine: busy {busy1 - busy0:.1f} CPU-s, idle {idle1 - idle0:.1f} "
        f"(/proc/stat); the sampler saw {sampled:.1f} CPU-s in "
        f"{sum(r.processes for r in rows)} processes, and used {own:.1f} itself"
    )
    print("\n".join(format_table(rows, args.min)))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                [
                    {"pid": s.pid, "name": s.comm, "cmdline": s.cmdline, "cpu_s": s.used}
                    for s in sorted(seen, key=lambda s: -s.used)
                    if s.used > 0
                ],
                indent=1,
            )
        )
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())

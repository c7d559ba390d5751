"""Where a command's CPU time goes, by kind of process: the pytest workers, the trial
actors, the `hpo` commands the end-to-end tests run, Ray's and MLflow's own processes,
the set-up's tools, and the kernel's threads.

    python3.11 bench/cpu_by_process.py -- env CI=true bash .ci/run
    python3.11 bench/cpu_by_process.py --json cpu.json --kind grpc=grpc_fork -- make test

(the standard library alone: it runs before the set-up makes a venv). The command runs
in a process group of its own, so that a ^C or a SIGTERM reaches it once, through the
sampler: it cannot read the terminal.

Every ``--every`` seconds it reads every process on the machine (``/proc/<pid>/stat``)
and counts the CPU time each used since the last sample under the kind the process has
at that sample, by its command line (a Ray worker retitles itself for each task or
actor it runs; a process already running when the command started counts from then
on). The whole machine is sampled, not the command's descendants: a Ray worker is the
raylet's child, not the test's, and the kernel's threads work for the command too. It
prints CPU-s per kind beside the machine's busy and idle time over the same span
(``/proc/stat``). A process that starts and ends between two samples is not seen, and
one that ends loses its last interval: the busy time less what was seen, less the
sampler's own, less the kernel's interrupt time, is what went unseen. Linux only. Exits
with the command's status. Results: bench/README.md, "Where the test suite's time goes".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PF_KTHREAD = 0x00200000  # the process flag of a kernel thread (proc(5), stat field 9)

# execnet's bootstrap: what a pytest-xdist worker's command line is.
XDIST_WORKER = "import sys;exec(eval(sys.stdin.readline()))"
# A Ray worker's title is ``ray::IDLE`` from its start until it runs a task or an actor,
# and while it loads the task's function or the actor's class (bench/README.md).
IDLE_RAY_WORKERS = "Ray workers while idle (starting up, or between tasks)"
HEADER = ("CPU-s", "share", "processes", "kind")

Rule = Callable[[str, str], bool]


def _runs(*programs: str) -> Rule:
    """A rule for a Python module or program: ``-m NAME`` or ``/bin/NAME`` in the command
    line (a bare word would also match a test's temporary path or an argument)."""
    return lambda comm, cmd: any(
        f"-m {p} " in f"{cmd} " or f"/bin/{p} " in f"{cmd} " for p in programs
    )


def _runs_bench_script(cmdline: str) -> bool:
    """Whether the program's first argument is a script of a ``bench/`` folder."""
    words = cmdline.split()
    return len(words) > 1 and re.fullmatch(r"(.*/)?bench/\w+\.py", words[1]) is not None


_SERVES_HTTP = _runs("uvicorn", "gunicorn")  # MLflow's server runs under one of them
_RUNS_HPO = _runs("hpo", "hpo.cli")

# First match wins. A Ray worker's command line is its title (``ray::IDLE``, then
# ``ray::ImplicitFunc.train`` while it holds a Tune trial); its name (comm) is the
# title's first 15 characters.
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
                for part in (
                    "ray/_private/",
                    "ray/autoscaler/",
                    "ray/dashboard/",
                    "ray.dashboard.",  # the dashboard's module processes
                    "/bin/ray ",
                )
            )
        ),
    ),
    (
        "MLflow tracking servers",
        lambda comm, cmd: "mlflow server" in cmd or _SERVES_HTTP(comm, cmd),
    ),
    (
        "`hpo` commands",
        lambda comm, cmd: "from hpo.cli import" in cmd or _RUNS_HPO(comm, cmd),
    ),
    ("pytest workers (xdist)", lambda comm, cmd: XDIST_WORKER in cmd),
    ("pytest (controller, child sessions)", _runs("pytest")),
    ("bench scripts", lambda comm, cmd: _runs_bench_script(cmd)),
    ("bytecode (compileall)", _runs("compileall")),
    ("mypy", _runs("mypy")),
    ("ruff", _runs("ruff")),
    ("pip", _runs("pip")),
    ("chromium", lambda comm, cmd: comm.startswith("chrom")),
)


def kind_of(
    comm: str, cmdline: str, *, kernel: bool = False, extra: Sequence[tuple[str, str]] = ()
) -> str:
    """The kind a process counts under: ``extra``'s (label, substring of the command line)
    first; a kernel thread by its name without the CPU number (``kworker/1:1H`` is
    ``kernel thread kworker``); then :data:`RULES`; else ``other: <name>`` (a process
    whose command line could not be read, having exited, among them)."""
    for label, part in extra:
        if part in cmdline:
            return label
    if kernel:
        return f"kernel thread {comm.split('/')[0]}"
    for label, rule in RULES:
        if rule(comm, cmdline):
            return label
    return f"other: {comm}"


@dataclass
class Seen:
    """One process as sampled: its latest name and command line, and the CPU-s it used
    while sampled, under each kind it had."""

    pid: int
    comm: str
    cmdline: str
    kernel: bool
    cpu: float
    """Its CPU time at the last sample, since it started."""
    sightings: int = 1
    by_kind: dict[str, float] = field(default_factory=dict)

    def charge(self, cpu: float, extra: Sequence[tuple[str, str]]) -> None:
        """Count what it used since the last sample under the kind it has now."""
        used = cpu - self.cpu
        if used > 0:
            kind = kind_of(self.comm, self.cmdline, kernel=self.kernel, extra=extra)
            self.by_kind[kind] = self.by_kind.get(kind, 0.0) + used
        self.cpu = max(self.cpu, cpu)


@dataclass(frozen=True)
class ProcessStat:
    key: str
    """The pid and its start time: a reused pid is another process."""
    comm: str
    cpu: float
    kernel: bool


def read_process(pid: str) -> ProcessStat | None:
    """``/proc/<pid>/stat``, or None once the process is gone."""
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    name_end = stat.rindex(")")
    comm = stat[stat.index("(") + 1 : name_end]
    fields = stat[name_end + 2 :].split()
    # Fields after the name, from 0: flags 6, utime 11, stime 12, starttime 19 (proc(5)).
    cpu = (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    return ProcessStat(f"{pid}:{fields[19]}", comm, cpu, bool(int(fields[6]) & PF_KTHREAD))


def read_cmdline(pid: str) -> str:
    """The process's command line, its arguments joined by spaces ("" once it is gone)."""
    try:
        raw = (PROC / pid / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def may_rename(process: Seen, comm: str) -> bool:
    """Whether ``process``'s command line may have changed since it was read: in its first
    samples (a forked child shows its parent's until it execs), when its name changed, or
    while it is an idle Ray worker, which may take a task or an actor at any time. Reading
    only these keeps the sampler at a small share of a core."""
    return (
        process.sightings <= 3
        or comm != process.comm
        or kind_of(process.comm, process.cmdline) == IDLE_RAY_WORKERS
    )


class Sampler:
    """Every process's CPU time from the first sample on (a process that starts later, from
    its start), each interval under the kind the process had when it ended."""

    def __init__(self, extra: Sequence[tuple[str, str]] = ()) -> None:
        self.extra = tuple(extra)
        self.seen: dict[str, Seen] = {}
        self.first = True

    def sample(self) -> None:
        for entry in os.listdir(PROC):
            if not entry.isdigit():
                continue
            stat = read_process(entry)
            if stat is None:
                continue
            known = self.seen.get(stat.key)
            if known is None:
                # A process running before the first sample counts from then on.
                baseline = stat.cpu if self.first else 0.0
                known = Seen(int(entry), stat.comm, read_cmdline(entry), stat.kernel, baseline)
                self.seen[stat.key] = known
            else:
                known.sightings += 1
                if may_rename(known, stat.comm):
                    known.cmdline = read_cmdline(entry) or known.cmdline
                known.comm = stat.comm
            known.charge(stat.cpu, self.extra)
        self.first = False


@dataclass(frozen=True)
class KindTotal:
    """One row of the table: the CPU-s of a kind, and how many processes spent them."""

    kind: str
    cpu_s: float
    processes: int


def totals(seen: Sequence[Seen]) -> list[KindTotal]:
    """CPU-s and processes per kind, largest first (a Ray worker that ran a trial and then
    went idle counts under both)."""
    by_kind: dict[str, list[float]] = {}
    for process in seen:
        for kind, cpu in process.by_kind.items():
            by_kind.setdefault(kind, []).append(cpu)
    rows = [KindTotal(k, sum(v), len(v)) for k, v in by_kind.items()]
    return sorted(rows, key=lambda r: (-r.cpu_s, r.kind))


def format_table(rows: Sequence[KindTotal], min_cpu_s: float) -> list[str]:
    """The table's lines; kinds under ``min_cpu_s`` are folded into one line."""
    total = sum(r.cpu_s for r in rows) or 1.0
    lines = ["{:>8} {:>6} {:>9}  {}".format(*HEADER)]
    small = [r for r in rows if r.cpu_s < min_cpu_s]
    for r in rows:
        if r.cpu_s >= min_cpu_s:
            lines.append(f"{r.cpu_s:8.1f} {r.cpu_s / total:6.1%} {r.processes:9d}  {r.kind}")
    if small:
        cpu = sum(r.cpu_s for r in small)
        n = sum(r.processes for r in small)
        kinds = "1 kind" if len(small) == 1 else f"{len(small)} kinds"
        lines.append(f"{cpu:8.1f} {cpu / total:6.1%} {n:9d}  {kinds} under {min_cpu_s:g} CPU-s")
    return lines


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU-s of the whole machine since boot (``/proc/stat``): busy is user,
    nice, system, interrupt and soft-interrupt time, idle counts I/O wait; steal (time
    the host ran something else) is in neither."""
    fields = [int(v) for v in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / TICKS_PER_S, (idle + iowait) / TICKS_PER_S


def exit_status(returncode: int) -> int:
    """A shell's exit status for a child's return code (a signal's is 128 + its number)."""
    return returncode if returncode >= 0 else 128 - returncode


def parse_kind(text: str) -> tuple[str, str]:
    label, sep, part = text.partition("=")
    if not sep or not label or not part:
        raise argparse.ArgumentTypeError(f"--kind wants LABEL=SUBSTRING, got {text!r}")
    return label, part


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"--every wants seconds above 0, got {text!r}")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--every", type=positive_seconds, default=0.5, help="seconds between samples"
    )
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

    sampler = Sampler(args.kind)
    sampler.sample()
    busy0, idle0 = machine_cpu()
    started = time.monotonic()
    running: list[subprocess.Popen[bytes]] = []

    def pass_on(signum: int, frame: FrameType | None) -> None:
        """A ^C at the terminal reaches the sampler alone (the command has a process group
        of its own): pass it on once to the whole command, as a SIGTERM too."""
        with contextlib.suppress(ProcessLookupError):  # the command has just ended
            if running:
                os.killpg(running[0].pid, signum)

    handlers = {
        signum: signal.signal(signum, pass_on) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        try:
            running.append(subprocess.Popen(command, process_group=0))
        except OSError as exc:
            print(f"cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
            return 127 if isinstance(exc, FileNotFoundError) else 126
        process = running[0]
        while process.poll() is None:
            time.sleep(args.every)
            sampler.sample()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    sampler.sample()
    wall = time.monotonic() - started
    busy1, idle1 = machine_cpu()

    me = os.getpid()
    seen = [s for s in sampler.seen.values() if s.pid != me]
    own = sum(sum(s.by_kind.values()) for s in sampler.seen.values() if s.pid == me)
    rows = totals(seen)
    shown = shlex.join(command).replace("\n", " ")
    shown = shown if len(shown) <= 100 else shown[:97] + "..."
    print(f"\n{shown}: exit {exit_status(process.returncode)} in {wall:.1f} s")
    print(
        f"the machine: busy {busy1 - busy0:.1f} CPU-s, idle {idle1 - idle0:.1f} "
        f"(/proc/stat); the sampler saw {sum(r.cpu_s for r in rows):.1f} CPU-s in "
        f"{len([s for s in seen if s.by_kind])} processes, and used {own:.1f} itself"
    )
    print("\n".join(format_table(rows, args.min)))
    if args.json is not None:
        processes = [s for s in seen if s.by_kind]
        processes.sort(key=lambda s: -sum(s.by_kind.values()))
        args.json.write_text(
            json.dumps(
                [
                    {"pid": s.pid, "name": s.comm, "cmdline": s.cmdline, "cpu_s": s.by_kind}
                    for s in processes
                ],
                indent=1,
            )
        )
    return exit_status(process.returncode)


if __name__ == "__main__":
    sys.exit(main())

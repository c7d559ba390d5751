"""The MLflow tracking server is stopped in the middle of a sweep, until the driver has
failed to send an epoch's metrics, and started again: the driver buffers what it could not
send and, at the end, every epoch's metric points of every trial are in MLflow, once each."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from cluster.tracking_server import start_tracking_server
from hpo.sweep import run_sweep
from tests.hpo.sweep_helpers import ONE_TFT, tiny_spec, trial_runs
from tests.processes import signal_all, wait_for
from tests.reliability.sweep_process import trial_workers

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]
EPOCHS = 8  # enough that the sweep is still training when the server goes down


class _Failures(logging.Handler):
    """The driver's warnings of MLflow calls that failed and wait to be sent again."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.times: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("MLflow unavailable (metrics of"):
            self.times.append((record.created, message))


def test_an_outage_loses_no_metric_point(ray_session, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    failures = _Failures()
    logging.getLogger("hpo.tracking").addHandler(failures)
    store = tmp_path / "mlflow-store"
    server = start_tracking_server(store, port=0)
    restarted: list = []
    try:
        port, uri = server.port, server.uri
        spec = tiny_spec(
            tmp_path,
            tracking_uri=server.uri,
            name="outage",
            **ONE_TFT,
            samples=2,
            max_epochs=EPOCHS,
            trainer={"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 15},
        )
        events: dict[str, Any] = {}

        def outage() -> None:
            try:
                wait_for(  # the first epoch reached MLflow: the sweep is under way
                    lambda: any("val_sharpe" in r.data.metrics for r in trial_runs(uri, "outage")),
                    timeout=300,
                    what="a trial's first epoch in MLflow",
                    interval=0.5,
                )
                # The trials' workers are held while the server stops (that takes seconds),
                # so the sweep's later epochs fall in the outage however fast they are.
                workers = trial_workers(os.getpid())
                signal_all(workers, signal.SIGSTOP)
                try:
                    server.stop()
                    events["down"] = time.time()
                finally:
                    signal_all(workers, signal.SIGCONT)
                # The outage lasts until an epoch's metrics failed to reach MLflow (the
                # driver buffers them), however long the machine takes to get there.
                wait_for(
                    lambda: any(t > events["down"] for t, _ in failures.times),
                    timeout=300,
                    what="an epoch's metrics failing to reach the stopped server",
                    interval=0.1,
                )
                events["up"] = time.time()
                restarted.append(start_tracking_server(store, port=port))
            except BaseException as exc:  # seen by the test, not lost with this thread
                events["error"] = exc

        controller = threading.Thread(target=outage, daemon=True)
        controller.start()
        rows = run_sweep(spec)
        controller.join(timeout=400)
    finally:
        logging.getLogger("hpo.tracking").removeHandler(failures)
        server.stop()
        for other in restarted:
            other.stop()
    assert "error" not in events, events.get("error")
    assert "down" in events and "up" in events
    assert len(rows) == 2 and all(r.status == "TERMINATED" and r.epochs == EPOCHS for r in rows)

    with start_tracking_server(store, port=0) as final:
        client = MlflowClient(final.uri)
        children = trial_runs(final.uri, "outage")
        assert len(children) == 2
        for run in children:
            assert run.info.status == "FINISHED"
            for key in ("val_sharpe", "train_loss", "test_sharpe"):
                history = client.get_metric_history(run.info.run_id, key)
                steps = [m.step for m in history]
                assert sorted(steps) == list(range(1, EPOCHS + 1)), (key, steps)
    # The outage hit the sweep: epochs' metrics failed to send while the server was down,
    # and reached MLflow once each after it came back (above).
    assert [m for t, m in failures.times if events["down"] < t < events["up"]], failures.times

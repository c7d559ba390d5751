"""The MLflow tracking server is stopped for 30 s in the middle of a sweep and started
again: the driver buffers what it could not send and, at the end, every epoch's metric
points of every trial are in MLflow, once each."""

from __future__ import annotations

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
EPOCHS = 8
OUTAGE_S = 30.0


def test_thirty_second_outage_loses_no_metric_point(ray_session, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
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
                time.sleep(OUTAGE_S)  # the outage itself
                events["up"] = time.time()
                restarted.append(start_tracking_server(store, port=port))
            except BaseException as exc:  # seen by the test, not lost with this thread
                events["error"] = exc

        controller = threading.Thread(target=outage, daemon=True)
        controller.start()
        rows = run_sweep(spec)
        controller.join(timeout=400)
    finally:
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
        during = []
        for run in children:
            assert run.info.status == "FINISHED"
            for key in ("val_sharpe", "train_loss", "test_sharpe"):
                history = client.get_metric_history(run.info.run_id, key)
                steps = [m.step for m in history]
                assert sorted(steps) == list(range(1, EPOCHS + 1)), (key, steps)
                during += [
                    m.step
                    for m in history
                    if key == "val_sharpe" and events["down"] < m.timestamp / 1000 < events["up"]
                ]
        # The outage hit the sweep: epochs were reported while the server was down.
        assert during, (events, "no epoch reported during the outage")

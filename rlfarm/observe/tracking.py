"""`rlfarm train --track` (CleanRL's --track, with MLflow in W&B's place): the run logged to an MLflow
tracking store beside its own files. The MLflow run is named after the rlfarm run id; its params are
the flat config (`ppo.learning_rate`, ...); its metrics are progress.csv's keys (charts/SPS,
losses/..., farm/...) plus each training episode's charts/episodic_return and the evaluations'
eval/mean_return, as TensorBoard gets them, at env steps; at the end the best and final policy files,
summary.json and the recorded videos are its artifacts and it is marked FINISHED, FAILED or KILLED.

Where: --track-uri, else MLFLOW_TRACKING_URI, else the file store ./mlruns (`mlflow ui` reads it).
MLflow 3 keeps its file store in maintenance mode behind MLFLOW_ALLOW_FILE_STORE, which rlfarm sets for
a file: URI it is given or defaults to; a database store (sqlite:///mlflow.db) needs the full
`mlflow` package. MLflow's usage telemetry is off unless MLFLOW_DISABLE_TELEMETRY says otherwise.
A resumed run (`--resume`) goes on logging into its MLflow run (RUN_DIR/mlflow.json). A tracking
store that fails mid-run warns once and the run goes on without it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rlfarm.config import flatten
from rlfarm.errors import TrackingError, TrackingPackageMissing
from rlfarm.observe.metrics import Sink

TRACK_EXTRA = 'pip install -e ".[track]"'
DEFAULT_URI = "./mlruns"
DEFAULT_EXPERIMENT = "rlfarm"
STATE_FILE = "mlflow.json"  # in the run directory: which MLflow run a resumed run goes on with
ARTIFACTS = ("best_policy.safetensors", "final_policy.safetensors", "summary.json", "config.json")

log = logging.getLogger("rlfarm.tracking")


def shown(uri: str) -> str:
    """A tracking URI for messages: a password in it masked."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class Tracking:
    """Where --track logs: a tracking URI and an experiment name."""

    uri: str
    experiment: str = DEFAULT_EXPERIMENT

    @classmethod
    def resolve(cls, uri: str | None = None, experiment: str | None = None) -> Tracking:
        """--track-uri, else MLFLOW_TRACKING_URI, else ./mlruns; a local path (or file: URI) becomes an
        absolute file: URI, so every process of a run (--seeds) logs to the same store."""
        uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
        scheme = urlsplit(uri).scheme
        if scheme in ("", "file"):
            path = uri[len("file:") :] if scheme == "file" else uri
            uri = Path(path.removeprefix("//") if path.startswith("///") else path).absolute().as_uri()
        return cls(uri, experiment or DEFAULT_EXPERIMENT)

    @property
    def is_file_store(self) -> bool:
        return urlsplit(self.uri).scheme == "file"

    def client(self) -> Any:
        """An MlflowClient for this store (TrackingError without mlflow)."""
        # rlfarm sends nothing but to the store named; MLflow's usage telemetry is the user's to turn on.
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise TrackingPackageMissing(
                f"--track logs to MLflow, which is not installed: {TRACK_EXTRA} (or pip install mlflow-skinny)"
            ) from None
        if self.is_file_store:  # MLflow 3 refuses its file store unless asked for it (module doc)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        return MlflowClient(tracking_uri=self.uri)

    def experiment_id(self, client: Any) -> str:
        found = client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        return client.create_experiment(self.experiment)


def check(tracking: Tracking) -> None:
    """Before anything starts: MLflow is installed and the store answers (the experiment found or made)."""
    client = tracking.client()
    try:
        tracking.experiment_id(client)
    except Exception as exc:  # noqa: BLE001 - MlflowException, OSError, a server's HTTP errors: one line
        raise TrackingError(
            f"--track: MLflow at {shown(tracking.uri)} refused experiment {tracking.experiment!r}: {_one_line(exc)}"
        ) from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:300] + " ..."


def _scalar(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class MlflowRun(Sink):
    """The run's MLflow run: params at the start, metrics as they are logged, artifacts at the end."""

    METRICS_PER_CALL = 1000  # MLflow's limits on one log_batch
    PARAMS_PER_CALL = 100

    def __init__(self, tracking: Tracking, run_dir: Path, config: Mapping[str, Any], resume: bool = False):
        from mlflow.entities import Param

        self.tracking, self.run_dir = tracking, Path(run_dir)
        self.client = tracking.client()
        self.pending: list[Any] = []
        self.failed = False
        state_file = self.run_dir / STATE_FILE
        previous = json.loads(state_file.read_text()) if resume and state_file.is_file() else {}
        if previous.get("tracking_uri") == tracking.uri:  # a resumed run goes on in its MLflow run
            self.run_id = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            log.info("tracking: resumed MLflow run %s at %s", self.run_id, shown(tracking.uri))
            return
        run_id = str(config.get("run_id", self.run_dir.name))
        tags = {
            "rlfarm.run_dir": str(self.run_dir.absolute()),
            "rlfarm.algo": str(config.get("algo")),
            "rlfarm.mode": str(config.get("mode")),
            "rlfarm.env": str(config.get("env", {}).get("id")),
        }
        run = self.client.create_run(tracking.experiment_id(self.client), run_name=run_id, tags=tags)
        self.run_id = run.info.run_id
        params = [
            Param(key, json.dumps(value) if isinstance(value, (list, dict)) else str(value))
            for key, value in sorted(flatten(dict(config)).items())
        ]
        for start in range(0, len(params), self.PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=params[start : start + self.PARAMS_PER_CALL])
        self.run_dir.mkdir(parents=True, exist_ok=True)
        state_file.write_text(
            json.dumps({"tracking_uri": tracking.uri, "experiment": tracking.experiment, "run_id": self.run_id}) + "\n"
        )
        log.info(
            "tracking: MLflow run %s (%s) at %s, experiment %r",
            self.run_id,
            run_id,
            shown(tracking.uri),
            tracking.experiment,
        )

    # ---- what the RunLogger tells ------------------------------------------------------------------
    def _add(self, key: str, value: Any, step: int) -> None:
        from mlflow.entities import Metric

        number = _scalar(value)
        if number is not None:  # NaN (no update yet) is left out, as TensorBoard leaves it
            self.pending.append(Metric(key, number, int(time.time() * 1000), int(step)))

    def scalars(self, global_step: int, row: Mapping[str, float]) -> None:
        for key, value in row.items():
            if key not in ("global_step", "wall_time"):
                self._add(key, value, global_step)
        self.flush()

    def episodes(self, global_step: int, returns: Any, lengths: Any) -> None:
        for ret, length in zip(returns, lengths):
            self._add("charts/episodic_return", ret, global_step)
            self._add("charts/episodic_length", length, global_step)

    def evaluation(self, global_step: int, returns: list[float], version: int, confirmation: bool) -> None:
        import numpy as np

        if confirmation:
            self._add("eval/confirmation_mean_return", np.mean(returns), global_step)
        else:
            self._add("eval/mean_return", np.mean(returns), global_step)
            self._add("eval/std_return", np.std(returns), global_step)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        if self.failed or not pending:
            return
        try:
            for start in range(0, len(pending), self.METRICS_PER_CALL):
                self.client.log_batch(self.run_id, metrics=pending[start : start + self.METRICS_PER_CALL])
        except Exception as exc:  # noqa: BLE001 - the store failing must not end the run
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        self.failed = True
        log.warning(
            "--track: MLflow at %s failed, the run goes on logging to its run directory only: %s: %s",
            shown(self.tracking.uri),
            type(exc).__name__,
            _one_line(exc),
        )

    def close(self, failing: BaseException | None) -> None:
        self.flush()
        if self.failed:
            return
        status = "FINISHED" if failing is None else "KILLED" if isinstance(failing, KeyboardInterrupt) else "FAILED"
        try:
            for name in ARTIFACTS:
                if (self.run_dir / name).is_file():
                    self.client.log_artifact(self.run_id, str(self.run_dir / name))
            videos = self.run_dir / "videos"
            if videos.is_dir() and any(videos.glob("*.mp4")):
                self.client.log_artifacts(self.run_id, str(videos), "videos")
            self.client.set_terminated(self.run_id, status)
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
        else:
            if failing is None and not sys.exc_info()[0]:
                log.info("tracking: MLflow run %s %s with its artifacts", self.run_id, status.lower())

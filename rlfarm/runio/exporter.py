"""Prometheus metrics of a trainer (`rlfarm train --metrics-port`) and of a worker (`rlfarm worker
--metrics-port`), served over HTTP by prometheus_client from a thread of that process.

Values are read when Prometheus scrapes: a collector calls a function that returns the process's
live numbers (counters and lengths it keeps anyway), so nothing is added to the training or acting
path. `TRAINER_METRICS` and `WORKER_METRICS` are the names docs/metrics.md documents; tests scrape a real
trainer and worker for them, and check that the autoscaling example (docs/keda-scaledobject.yaml)
only asks for names listed here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rlfarm.errors import MetricsError

METRICS_EXTRA = 'pip install -e ".[metrics]"'
DEFAULT_HOST = "127.0.0.1"  # what a bare port binds: say 0.0.0.0:PORT to be scraped from elsewhere


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # "gauge" | "counter"
    help: str
    key: str  # its value's key in the live numbers
    labels: tuple[str, ...] = ()  # beside the process's own label (run or worker)


TRAINER_METRICS = (
    Metric("rlfarm_run_env_steps", "counter", "Env steps consumed by the learner.", "env_steps"),
    Metric("rlfarm_run_env_steps_per_second", "gauge", "Env steps per second since the run started.", "sps"),
    Metric("rlfarm_run_policy_version", "gauge", "Newest published policy version.", "policy_version"),
    Metric(
        "rlfarm_run_tasks_wanted",
        "gauge",
        "Tasks the run asks of the farm's slots now: queued or running, and held back by its share "
        "(what an autoscaler sizes the workers by).",
        "tasks_wanted",
    ),
    Metric("rlfarm_run_tasks_in_flight", "gauge", "Tasks sent and not yet answered.", "tasks_in_flight"),
    Metric("rlfarm_run_tasks_held", "gauge", "Tasks held back in the trainer by the run's fair share.", "tasks_held"),
    Metric(
        "rlfarm_run_slots_waiting",
        "gauge",
        "ASYNC: fraction of the farm's slot time waiting for the learner (last log step).",
        "slots_waiting",
    ),
    Metric(
        "rlfarm_run_policy_lag",
        "gauge",
        "Policy lag of the results consumed at the last log step (versions), by statistic.",
        "policy_lag",
        ("stat",),
    ),
    Metric("rlfarm_run_results", "counter", "Results taken in, by outcome.", "results", ("outcome",)),
    Metric("rlfarm_run_tasks_resent", "counter", "Tasks sent again, by reason.", "resent", ("reason",)),
    Metric(
        "rlfarm_run_policy_fetches",
        "counter",
        "Policy versions fetched from Redis by the run's tasks (not from a worker's cache).",
        "policy_fetches",
    ),
    Metric(
        "rlfarm_run_policy_fetch_bytes",
        "counter",
        "Bytes of those fetches (fetches times the size of a version).",
        "policy_fetch_bytes",
    ),
    Metric("rlfarm_run_redis_outages", "counter", "Redis outages the trainer rode out.", "redis_outages"),
    Metric(
        "rlfarm_farm_tasks_queued",
        "gauge",
        "Task messages waiting in the broker queue, all runs (last log step).",
        "tasks_queued",
    ),
)

WORKER_METRICS = (
    Metric("rlfarm_worker_slots", "gauge", "Pool processes of this worker (tasks it runs at once).", "slots"),
    Metric("rlfarm_worker_slots_busy", "gauge", "Pool processes running an rlfarm task now.", "slots_busy"),
    Metric("rlfarm_worker_tasks", "counter", "Tasks its pool processes ran.", "tasks"),
    Metric(
        "rlfarm_worker_policy_fetches",
        "counter",
        "Policy versions its pool processes fetched from Redis.",
        "policy_fetches",
    ),
    Metric("rlfarm_worker_policy_fetch_bytes", "counter", "Bytes of those fetches.", "policy_fetch_bytes"),
    Metric("rlfarm_worker_redis_outages", "counter", "Redis outages its pool processes rode out.", "redis_outages"),
)

INFO = {
    "trainer": ("rlfarm_run_info", "The run: its algorithm, mode and env (value 1).", ("algo", "mode", "env")),
    "worker": ("rlfarm_worker_info", "This worker's rlfarm and protocol versions (value 1).", ("version", "protocol")),
}


def exposed_names(metrics: tuple[Metric, ...], side: str) -> set[str]:
    """The sample names Prometheus sees (counters end in _total)."""
    return {m.name + ("_total" if m.kind == "counter" else "") for m in metrics} | {INFO[side][0]}


def parse_listen(text: str) -> tuple[str, int]:
    """`PORT` (on 127.0.0.1) or `HOST:PORT` (`0.0.0.0:9101`, `[::]:9101`) -> (host, port)."""
    host, sep, port = str(text).strip().rpartition(":")
    host = host.strip("[]") if sep else DEFAULT_HOST
    try:
        number = int(port)
        if not 0 < number < 65536:
            raise ValueError
        ipaddress.ip_address(host)
    except ValueError:
        raise MetricsError(
            f"--metrics-port {text!r} is not PORT or HOST:PORT with a port from 1 to 65535 "
            f"and a numeric address (like 9101 or 0.0.0.0:9101)"
        ) from None
    return host, number


def check_available() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise MetricsError(
            f"--metrics-port needs prometheus_client, which is not installed here: "
            f"{METRICS_EXTRA} in the rlfarm checkout (or pip install 'rlfarm[metrics]')"
        ) from None


class LiveCollector:
    """Yields `metrics` from `values()` at each scrape; `labels()` gives the process's own labels
    (run, or worker) and the info metric's."""

    def __init__(
        self,
        side: str,
        metrics: tuple[Metric, ...],
        own_label: str,
        labels: Callable[[], Mapping[str, str]],
        values: Callable[[], Mapping[str, Any]],
    ):
        self.side, self.metrics, self.own_label = side, metrics, own_label
        self.labels, self.values = labels, values

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels, values = self.labels(), self.values()
        own = str(labels.get(self.own_label, ""))
        name, doc, info_labels = INFO[self.side]
        info = GaugeMetricFamily(name, doc, labels=[self.own_label, *info_labels])
        info.add_metric([own, *[str(labels.get(k, "")) for k in info_labels]], 1)
        yield info
        for m in self.metrics:
            value = values.get(m.key)
            if value is None:
                continue  # not known (yet): absent rather than a made-up 0
            family = (CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily)(
                m.name, m.help, labels=[self.own_label, *m.labels]
            )
            if m.labels:  # a mapping from the extra label's value to the number
                for label, number in value.items():
                    family.add_metric([own, str(label)], float(number))
            else:
                family.add_metric([own], float(value))
            yield family


class Exporter:
    """A started HTTP server for one collector; `close()` stops it."""

    def __init__(self, server: Any, host: str, port: int):
        self.server, self.host, self.port = server, host, port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(collector: LiveCollector, host: str, port: int) -> Exporter:
    """Serve `collector` (and this process's CPU and memory) on host:port from a daemon thread."""
    check_available()
    from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)  # its thread is a daemon
    except OSError as exc:
        raise MetricsError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    return Exporter(server, host, port)

"""Metrics a cluster can scrape and a signal autoscalers can use: `rlfarm worker --metrics-port`,
`rlfarm train --metrics-port` (Prometheus, rlfarm.runio.exporter), `rlfarm status --json`'s schema
(rlfarm/commands/status.schema.json) and the KEDA example (docs/keda-scaledobject.yaml).

The farm test scrapes a real `rlfarm worker` and a real `rlfarm train` on 127.0.0.1 while the run
trains, and finds every metric the docs name (docs/metrics.md).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import jsonschema
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlfarm.commands.status import SCHEMA_FILE, MemoryStatus, RunStatus, Share, Snapshot, WorkerStatus, to_json
from rlfarm.core.protocol import PROTOCOL
from rlfarm.local.cluster import LocalCluster, free_port
from rlfarm.runio import exporter as E
from rlfarm.worker import counters as C

from .conftest import ROOT, WORKER_ENV, one_error_line, poll, run_cli, start_command

KEDA_EXAMPLE = ROOT / "docs" / "keda-scaledobject.yaml"
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]  # the README leads; the reference is in docs/


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus text -> {(sample name, sorted labels): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def names(text: str) -> set[str]:
    return {name for name, _ in samples(text)}


def value(text: str, name: str, **labels: str) -> float | None:
    for (n, lab), v in samples(text).items():
        if n == name and all(dict(lab).get(k) == x for k, x in labels.items()):
            return v
    return None


# ---- pure parts ----------------------------------------------------------------------------------
def test_listen_addresses_are_a_port_or_host_and_port():
    assert E.parse_listen("9101") == ("127.0.0.1", 9101)  # loopback unless asked
    assert E.parse_listen("0.0.0.0:9101") == ("0.0.0.0", 9101)
    assert E.parse_listen("[::1]:9101") == ("::1", 9101)
    for bad in ("abc", "0", "70000", "metrics-host:9101", "1.2.3.4:", ""):
        with pytest.raises(E.MetricsError, match="is not PORT or HOST:PORT"):
            E.parse_listen(bad)


def test_node_counters_add_up_each_processs_own_totals_and_never_reuse_a_row(monkeypatch):
    counters = C.NodeCounters(rows=8)
    pid = [101]
    monkeypatch.setattr(C, "current_pid", lambda: pid[0])
    counters.store(tasks=3, policy_fetches=2, policy_fetch_bytes=2000, redis_outages=0)
    counters.store(tasks=4, policy_fetches=2, policy_fetch_bytes=2000, redis_outages=1)  # its totals, replaced
    pid[0] = 202  # another pool process
    counters.store(tasks=1, policy_fetches=1, policy_fetch_bytes=1000, redis_outages=0)
    assert counters.totals() == {"tasks": 5, "policy_fetches": 3, "policy_fetch_bytes": 3000, "redis_outages": 1}
    # A process forked later that got the dead first one's pid starts a row of its own: the dead
    # one's totals stay counted (a Prometheus counter never goes down).
    counters._row_pid = 0
    pid[0] = 101
    counters.store(tasks=1)
    assert counters.totals()["tasks"] == 6
    assert sorted(p for p in counters.pids if p) == [101, 101, 202]


def test_a_full_table_of_rows_drops_counts_instead_of_sharing_a_row(monkeypatch):
    counters = C.NodeCounters(rows=2)
    for n, pid in enumerate((1, 2, 3)):
        monkeypatch.setattr(C, "current_pid", lambda pid=pid: pid)
        counters.store(tasks=10 * (n + 1))
    assert counters.totals()["tasks"] == 30  # the third process found no row: its 30 are not shown


def scrape_collector(collector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def test_the_collector_exports_live_values_with_the_runs_label_and_leaves_unknown_ones_out():
    live = {
        "env_steps": 4096,
        "sps": 512.5,
        "tasks_wanted": 3,
        "policy_lag": {"mean": 1.5, "max": 3},
        "results": {"accepted": 7, "duplicate": 1},
        "slots_waiting": None,
    }
    collector = E.LiveCollector(
        "trainer",
        E.TRAINER_METRICS,
        "run",
        lambda: {"run": "r1", "algo": "ppo", "mode": "async", "env": "CartPole-v1"},
        lambda: live,
    )
    text = scrape_collector(collector)
    assert value(text, "rlfarm_run_env_steps_total", run="r1") == 4096
    assert value(text, "rlfarm_run_env_steps_per_second", run="r1") == 512.5
    assert value(text, "rlfarm_run_tasks_wanted", run="r1") == 3
    assert value(text, "rlfarm_run_policy_lag", run="r1", stat="max") == 3
    assert value(text, "rlfarm_run_results_total", run="r1", outcome="duplicate") == 1
    assert value(text, "rlfarm_run_info", run="r1", algo="ppo", mode="async", env="CartPole-v1") == 1
    assert "rlfarm_run_slots_waiting" not in text  # unknown (SYNC, or before a log step): absent, not 0
    live["env_steps"] = 8192  # read at each scrape
    assert value(scrape_collector(collector), "rlfarm_run_env_steps_total", run="r1") == 8192


def test_every_metric_is_documented():
    docs = "\n".join(path.read_text() for path in DOCS)
    for side, metrics in (("trainer", E.TRAINER_METRICS), ("worker", E.WORKER_METRICS)):
        for name in E.exposed_names(metrics, side):
            assert f"`{name}`" in docs, name


def test_the_keda_example_scales_on_metrics_that_exist():
    """docs/keda-scaledobject.yaml parses, is a KEDA ScaledObject of the worker Deployment, and every
    rlfarm metric its Prometheus queries name is one the trainer or the workers export."""
    docs = list(yaml.safe_load_all(KEDA_EXAMPLE.read_text()))
    [scaled] = [d for d in docs if d and d.get("kind") == "ScaledObject"]
    assert scaled["apiVersion"].startswith("keda.sh/")
    assert scaled["spec"]["scaleTargetRef"]["name"]
    triggers = [t for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]
    assert triggers
    exported = E.exposed_names(E.TRAINER_METRICS, "trainer") | E.exposed_names(E.WORKER_METRICS, "worker")
    for trigger in triggers:
        meta = trigger["metadata"]
        used = set(re.findall(r"rlfarm_[a-z_]+", meta["query"]))
        assert used and used <= exported, used - exported
        assert float(meta["threshold"]) > 0
    # The worker Deployment it scales serves the metrics the scrape config reads.
    [deployment] = [d for d in docs if d and d.get("kind") == "Deployment"]
    assert deployment["metadata"]["name"] == scaled["spec"]["scaleTargetRef"]["name"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    command = " ".join(container.get("command", []) + container.get("args", []))
    assert "rlfarm worker" in command and "--metrics-port 0.0.0.0:" in command


def test_status_json_has_a_schema_and_the_farms_totals():
    schema = json.loads(SCHEMA_FILE.read_text())
    share = Share(weight=1.0, demand=5, cap=None, used=0.5, slots=4)
    snap = Snapshot(
        redis="redis://h:1/0",
        taken=10.0,
        queue_depth=2,
        memory=MemoryStatus(2048, "2.00K", 0, "0B", "noeviction"),
        workers=[WorkerStatus("w@h", 4, [1, 2, 3, 4], 9, 7, "0.1.0")],
        runs=[RunStatus("a", share=share), RunStatus("b", share=share), RunStatus("c")],
    )
    data = json.loads(to_json(snap))
    jsonschema.validate(data, schema)
    assert data["schema"] == 1
    assert data["farm"] == {"slots": 4, "tasks_queued": 2, "tasks_wanted": 10, "runs_training": 2, "source": None}
    data["farm"]["slots"] = "four"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


# ---- bad input, one line ---------------------------------------------------------------------------
@pytest.mark.process
def test_bad_metrics_ports_are_one_line_before_anything_starts():
    bad = run_cli("worker", "--metrics-port", "nine", "--redis", "redis://127.0.0.1:1/0")
    assert bad.returncode == 2 and "is not PORT or HOST:PORT" in one_error_line(bad.stderr)
    seeds = run_cli("train", "--seeds", "1-2", "--metrics-port", "9101")
    assert seeds.returncode == 2 and "--seeds starts one trainer per seed" in one_error_line(seeds.stderr)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = run_cli("train", "--metrics-port", str(port), "--total-steps", "100")
        assert busy.returncode == 1, busy.stderr
        assert f"cannot listen on 127.0.0.1:{port}" in one_error_line(busy.stderr)


# ---- a real worker and trainer, scraped ------------------------------------------------------------
def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def scrape_or_empty(port: int) -> str:
    try:
        return scrape(port)
    except OSError:  # not listening yet
        return ""


@pytest.mark.farm
def test_a_real_worker_and_trainer_serve_the_documented_metrics(tmp_path):
    """`rlfarm worker -c 2 --metrics-port` and `rlfarm train --mode async --metrics-port` on one Redis:
    while the run trains, both endpoints carry every metric the docs name for them, with values
    that follow the run (env steps, fetches, bytes, busy slots), and `rlfarm status --json` validates
    against its schema and counts the run; Ctrl-C stops the run and closes its endpoint."""
    worker_port, trainer_port = free_port(), free_port()
    with LocalCluster(
        workers=0, name=f"rlfarm-test-metrics-{os.getpid()}", log_dir=tmp_path, extra_env=WORKER_ENV
    ) as cluster:
        cluster.add_worker(
            2,
            command=[
                sys.executable,
                str(ROOT / "cli.py"),
                "worker",
                "-l",
                "WARNING",
                "--metrics-port",
                f"127.0.0.1:{worker_port}",
            ],
        )
        node = cluster._nodes[0]
        train = start_command(
            "train",
            "--redis",
            cluster.redis_url,
            "--run-id",
            "metrics",
            "--logdir",
            str(tmp_path),
            "--preset",
            "cartpole-ppo",
            "--mode",
            "async",
            "--env",
            "tests.tiny_envs:slow",
            "--set",
            "env.num_envs=1",
            "--set",
            "farm.steps_per_env=200",
            "--set",
            "ppo.num_minibatches=2",
            "--total-steps",
            "10000000",
            "--metrics-port",
            str(trainer_port),
            env={**os.environ, **WORKER_ENV},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            trainer_names = E.exposed_names(E.TRAINER_METRICS, "trainer")
            # A result that fetched its policy can arrive after one that did not: the node's other
            # process takes the version from the machine's cache (tests/test_machine.py), so the first
            # env steps may come before the first fetch is counted. Both are waited for.
            text = poll(
                lambda: (
                    (t := scrape_or_empty(trainer_port))
                    and trainer_names <= names(t)
                    and value(t, "rlfarm_run_env_steps_total") > 0
                    and (value(t, "rlfarm_run_policy_fetches_total", run="metrics") or 0) >= 1
                    and t
                ),
                "the trainer's endpoint with every documented metric, env steps and a policy fetch",
                proc=train,
                deadline_s=300,
            )
            assert (
                value(text, "rlfarm_run_info", run="metrics", algo="ppo", mode="async", env="tests.tiny_envs:slow") == 1
            )
            assert value(text, "rlfarm_run_policy_fetches_total", run="metrics") >= 1
            assert value(text, "rlfarm_run_policy_fetch_bytes_total", run="metrics") > 1000
            assert value(text, "rlfarm_run_tasks_in_flight", run="metrics") >= 1

            worker_names = E.exposed_names(E.WORKER_METRICS, "worker")
            wtext = poll(
                lambda: (t := scrape(worker_port)) and value(t, "rlfarm_worker_tasks_total") and t,
                "the worker's endpoint with a task counted",
                proc=train,
            )
            assert worker_names <= names(wtext), worker_names - names(wtext)
            assert value(wtext, "rlfarm_worker_slots", worker=node) == 2
            assert value(wtext, "rlfarm_worker_policy_fetches_total", worker=node) >= 1
            assert value(wtext, "rlfarm_worker_policy_fetch_bytes_total", worker=node) > 1000
            assert value(wtext, "rlfarm_worker_info", worker=node, protocol=str(PROTOCOL)) == 1
            poll(
                lambda: value(scrape(worker_port), "rlfarm_worker_slots_busy", worker=node) >= 1,
                "a busy slot while the run's tasks run",
                proc=train,
            )

            status = run_cli("status", "--json", "--redis", cluster.redis_url)
            assert status.returncode == 0, status.stderr
            snap = json.loads(status.stdout)
            jsonschema.validate(snap, json.loads(SCHEMA_FILE.read_text()))
            assert snap["farm"]["slots"] == 2 and snap["farm"]["runs_training"] == 1

            train.send_signal(signal.SIGINT)  # Ctrl-C: the run stops, and its endpoint with it
            _, stderr = train.communicate(timeout=300)
            assert train.returncode == 130, stderr[-3000:]
            assert f"Prometheus metrics of run metrics at http://127.0.0.1:{trainer_port}/metrics" in stderr
        finally:
            if train.poll() is None:
                train.kill()
                train.wait()
        with pytest.raises(OSError):
            scrape(trainer_port)

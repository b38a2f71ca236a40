"""`rlfarm up --listen`: a farm other machines join with the one line `up` prints. The "other machine"
is a network namespace this test makes, joined to the farm's namespace by a veth pair: the join line is
typed there as printed, its worker runs the run's tasks beside the farm's own, and `rlfarm down` on
the farm's side tells it to stop."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from rlfarm.local import farm as localfarm

from .conftest import WORKER_ENV, poll, rlfarm_cmd
from .test_partitions import needs_netns, sh

FARM_ADDRESS, JOINER_ADDRESS = "10.214.0.1", "10.214.0.2"

RUN = [
    "--env",
    "tests.tiny_envs:slow",  # tasks of 1 s each: both machines' workers get some
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.num_tasks=4",
    "--set",
    "farm.steps_per_env=500",
    "--set",
    "ppo.num_minibatches=2",
    "--set",
    "policy.hidden_sizes=[16]",
    "--set",
    "eval.interval=0",
    "--total-steps",
    "4000",
]


# ---- pure helpers ---------------------------------------------------------------------------------
@pytest.mark.unit
def test_what_redis_binds_for_each_listen_address():
    assert localfarm.listen_addresses(None) == ("127.0.0.1",)
    assert localfarm.listen_addresses("127.0.0.1") == ("127.0.0.1",)
    assert localfarm.listen_addresses("10.0.0.5") == ("127.0.0.1", "10.0.0.5")
    assert localfarm.listen_addresses("0.0.0.0") == ("0.0.0.0",)  # 127.0.0.1 is among all


@pytest.mark.unit
def test_the_join_line_keeps_the_url_and_secret_out_of_the_workers_arguments():
    line = localfarm.join_command("pw", "10.0.0.5", 6400, "s3cret")
    words = shlex.split(line)
    assert words[:2] == ["RLFARM_REDIS_URL=redis://:pw@10.0.0.5:6400/0", "RLFARM_SECRET=s3cret"]
    assert words[2:] == ["rlfarm", "worker"]
    assert localfarm.joinable_address("10.0.0.5") == "10.0.0.5"


@pytest.mark.unit
@pytest.mark.parametrize(
    "given, said",
    [
        ("farm-host", "--listen wants an IPv4 address of this machine (or 0.0.0.0 for all), got 'farm-host'"),
        ("192.0.2.77", "--listen 192.0.2.77: not an address of this machine"),
    ],
    ids=["a-host-name", "not-this-machines"],
)
def test_a_listen_address_that_is_none_of_this_machines_is_refused_in_one_line(given, said):
    from click.testing import CliRunner

    from rlfarm.cli.farm import up

    result = CliRunner().invoke(up, ["--listen", given])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], result.output


# ---- two machines -----------------------------------------------------------------------------------
@pytest.fixture
def machines():
    """The farm's namespace and the joiner's, a veth pair between them, each with its loopback up."""
    pid = os.getpid()
    farm_ns, joiner_ns = f"rf-farm-{pid}", f"rf-joiner-{pid}"
    made = []
    try:
        for ns in (farm_ns, joiner_ns):
            sh("ip", "netns", "add", ns)
            made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", farm_ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", joiner_ns)
        for ns, address in ((farm_ns, FARM_ADDRESS), (joiner_ns, JOINER_ADDRESS)):
            sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        # A default route, as a machine has: `--listen 0.0.0.0` names the address it leaves from.
        sh("ip", "-n", farm_ns, "route", "add", "default", "via", JOINER_ADDRESS)
        yield farm_ns, joiner_ns
    finally:
        for ns in reversed(made):  # the veth pair goes with them
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def in_ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *rlfarm_cmd(*args)]


@needs_netns
@pytest.mark.farm
@pytest.mark.parametrize("listen", [FARM_ADDRESS, "0.0.0.0"])
def test_a_machine_joins_with_the_line_up_prints_runs_tasks_and_is_stopped_by_down(machines, tmp_path, listen):
    farm_ns, joiner_ns = machines
    base = {k: v for k, v in os.environ.items() if k not in ("RLFARM_REDIS_URL", "RLFARM_SECRET")}
    farm_env = {**base, **WORKER_ENV, "RLFARM_HOME": str(tmp_path / "farm-home")}
    joiner_env = {**base, **WORKER_ENV, "RLFARM_HOME": str(tmp_path / "joiner-home")}

    def on_farm(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(in_ns(farm_ns, *args), env=farm_env, capture_output=True, text=True, timeout=timeout)

    up = on_farm("up", "-w", "1", "--no-flower", "--allow-env-module", "tests.tiny_envs", "--listen", listen)
    assert up.returncode == 0, up.stderr
    state = json.loads((tmp_path / "farm-home" / "local-farm.json").read_text())
    joiner = None
    try:
        said = up.stdout.splitlines()
        at = next(i for i, line in enumerate(said) if line.startswith("other machines join it with"))
        join = said[at + 1].strip()
        assert join == state["join"] and f"@{FARM_ADDRESS}:" in join, up.stdout
        # typed on the other machine as printed: the URL and secret from the line, `rlfarm worker` ours
        words = shlex.split(join)
        assigned = dict(word.split("=", 1) for word in words if "=" in word)
        assert [w for w in words if "=" not in w] == ["rlfarm", "worker"]
        log = open(tmp_path / "joiner.log", "w")
        joiner = subprocess.Popen(
            in_ns(joiner_ns, "worker", "-c", "1", "-n", "joined@%h", "-l", "INFO"),
            env={**joiner_env, **assigned},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        poll(
            lambda: "joined@" in on_farm("status", timeout=60).stdout,
            "the joined worker in the farm's status",
            joiner,
            tmp_path / "joiner.log",
        )
        train = on_farm("train", "--run-id", "joined", "--logdir", str(tmp_path / "runs"), *RUN)
        assert train.returncode == 0, train.stderr[-2000:]
        text = (tmp_path / "joiner.log").read_text(errors="replace")
        assert "rlfarm.rollout" in text and "succeeded" in text, text[-3000:]

        down = on_farm("down")
        assert down.returncode == 0, down.stderr
        assert "told the workers that joined it to stop: joined@" in down.stdout, down.stdout
        joiner.wait(timeout=60)  # it stops by itself: told, not killed
        joiner = None
    finally:
        if joiner is not None and joiner.poll() is None:
            os.killpg(joiner.pid, 9)
        if (tmp_path / "farm-home" / "local-farm.json").exists():
            on_farm("down")
    assert not any(localfarm.alive(pid) for pid in state["pids"])

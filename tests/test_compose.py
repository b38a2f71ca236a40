"""docker-compose.yml kept honest without a Docker engine.

The file is resolved by a real Compose implementation (Debian's `docker-compose`, Compose v1 1.29.2 on
Debian 12, which packages no v2; it needs no engine for `config`; v2's `docker compose`, which the deploy
docs use, resolves it too where installed), its structure is checked, and then each service's resolved command and
environment are started as local processes (host `redis` mapped to 127.0.0.1 and a free port), so a
command or variable that drifts from the CLI breaks here, not on someone's cluster.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis
import yaml

from rlfarm.farm.app import make_app
from rlfarm.local.cluster import find_redis_server, free_port, stop_process_group

from .conftest import ROOT, WORKER_ENV, http_request, pid_alive, poll

COMPOSE = ROOT / "docker-compose.yml"
EXPOSE = ROOT / "docker-compose.expose.yml"
SENTINEL = ROOT / "docker-compose.sentinel.yml"
ENV_EXAMPLE = ROOT / ".env.example"
SECRETS = ("REDIS_PASSWORD", "FLOWER_BASIC_AUTH")


def docker_compose() -> str:
    path = shutil.which("docker-compose")
    if not path:
        # Not a skip: without it nothing here is checked, and CI (.ci/run) installs it.
        pytest.fail(
            "docker-compose not found: install Debian's package "
            "(`apt-get install docker-compose redis-server`, as .ci/run does)"
        )
    return path


def env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def write_env(tmp_path: Path, drop: tuple[str, ...] = (), **overrides: str) -> tuple[Path, dict[str, str]]:
    """A .env made from .env.example, with fresh test secrets in place of the placeholders."""
    values = {
        **env_example(),
        "REDIS_PASSWORD": secrets.token_hex(16),
        "FLOWER_BASIC_AUTH": f"admin:{secrets.token_hex(8)}",
        **overrides,
    }
    for key in drop:
        values.pop(key)
    path = tmp_path / "test.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path, values


def compose_env() -> dict[str, str]:
    # The shell's own values would override the env file's; the test must see only the file.
    names = set(env_example()) | {"RLFARM_REDIS_URL"}
    return {k: v for k, v in os.environ.items() if k not in names and not k.startswith("COMPOSE_")}


def run_config(env_file: Path, *files: Path) -> subprocess.CompletedProcess:
    cmd = [docker_compose()]
    for f in files or (COMPOSE,):
        cmd += ["-f", str(f)]
    return subprocess.run(
        [*cmd, "--env-file", str(env_file), "config"], capture_output=True, text=True, env=compose_env(), cwd=ROOT
    )


def compose_config(env_file: Path, *files: Path) -> dict:
    proc = run_config(env_file, *files)
    assert proc.returncode == 0, f"docker-compose config failed:\n{proc.stderr}"
    return yaml.safe_load(proc.stdout)


# Compose v1 prints short syntax, v2 long syntax: normalise both.
def ports(service: dict) -> list[tuple[str, str, str]]:
    """(host_ip, published, target) of each published port."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):
            out.append((p.get("host_ip", ""), str(p.get("published", "")), str(p["target"])))
        else:
            parts = str(p).split("/")[0].split(":")
            parts = [""] * (3 - len(parts)) + parts
            out.append((parts[0], parts[1], parts[2]))
    return out


def volumes(service: dict) -> dict[str, str]:
    """target -> source of each mounted volume."""
    out = {}
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out[v["target"]] = v.get("source", "")
        else:
            source, target = str(v).split(":")[:2]
            out[target] = source
    return out


def seconds(duration: str | int | float) -> float:
    if isinstance(duration, (int, float)):
        return float(duration)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts, f"unparsable duration {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def arg_after(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


# ---- the files ------------------------------------------------------------------------------------
def test_env_example_documents_every_variable_the_compose_files_use():
    used = set()
    for f in (COMPOSE, EXPOSE, SENTINEL):
        # $${...} is the shell's, escaped from Compose
        used |= set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", f.read_text()))
    example = env_example()
    assert used - set(example) == set(), "variables missing from .env.example"
    lines = ENV_EXAMPLE.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip() and not line.startswith("#"):
            assert i > 0 and lines[i - 1].startswith("#"), f"{line!r} has no comment above it"
    for key in SECRETS:
        assert "CHANGE-ME" in example[key], f"{key} in .env.example must be an obvious placeholder"


@pytest.mark.process
def test_missing_password_is_a_clear_error(tmp_path):
    env_file, _ = write_env(tmp_path, drop=("REDIS_PASSWORD",))
    proc = run_config(env_file)
    assert proc.returncode != 0
    assert "set REDIS_PASSWORD in .env" in proc.stderr


@pytest.mark.process
def test_compose_structure(tmp_path):
    env_file, values = write_env(tmp_path)
    services = compose_config(env_file)["services"]
    assert set(services) == {"check-secrets", "redis", "worker", "trainer", "flower"}
    password = values["REDIS_PASSWORD"]

    r = services["redis"]
    assert r["image"].startswith("redis:7")
    assert ports(r) == [], "Redis must not be published by default"
    cmd = r["command"]
    assert cmd[0] == "redis-server"
    assert arg_after(cmd, "--requirepass") == password
    assert arg_after(cmd, "--appendonly") == "yes" and arg_after(cmd, "--appendfsync") == "everysec"
    assert arg_after(cmd, "--maxmemory") == values["REDIS_MAXMEMORY"]
    assert arg_after(cmd, "--maxmemory-policy") == "noeviction"
    test = r["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "redis-cli" and "ping" in test
    assert password not in " ".join(test) and "-a" not in test, "password in the healthcheck's argv"
    assert r["environment"]["REDISCLI_AUTH"] == password
    assert volumes(r).get("/data"), "Redis data must live on a named volume"

    url = f"redis://:{password}@redis:6379/0"
    image = services["worker"]["image"]
    for name in ("worker", "trainer", "flower"):
        s = services[name]
        assert s["image"] == image and "build" in s, f"{name} must use the one rlfarm image"
        assert s["environment"]["RLFARM_REDIS_URL"] == url
        assert password not in " ".join(s["command"]), f"{name}: password on the command line"
        assert s["depends_on"]["redis"]["condition"] == "service_healthy"

    w = services["worker"]
    assert "container_name" not in w and ports(w) == [], "worker must scale (--scale worker=N)"
    assert w["command"][:2] == ["rlfarm", "worker"] and "-E" in w["command"]
    assert arg_after(w["command"], "--concurrency") == values["WORKER_CONCURRENCY"]
    assert w["restart"] == "unless-stopped"
    assert seconds(w["stop_grace_period"]) >= 60, "too short for a warm shutdown"

    t = services["trainer"]
    assert t["command"][:2] == ["rlfarm", "train"]
    assert arg_after(t["command"], "--mode") == "async"
    assert arg_after(t["command"], "--preset") == values["RLFARM_PRESET"]
    assert arg_after(t["command"], "--run-id") == values["RLFARM_RUN_ID"]
    assert t["restart"] == "on-failure"
    assert arg_after(t["command"], "--if-exists") == "resume", "a restarted trainer must resume its run"
    assert volumes(t).get(arg_after(t["command"], "--logdir")), "runs must live on a named volume"
    assert "--redis" not in t["command"]

    f = services["flower"]
    assert f["command"][:4] == ["celery", "-A", "tasks", "flower"]
    assert f["environment"]["FLOWER_BASIC_AUTH"] == values["FLOWER_BASIC_AUTH"]
    assert not any("basic" in a for a in f["command"]), "basic auth belongs in the environment"
    assert ports(f) == [(values["FLOWER_BIND"], "5555", "5555")]
    assert values["FLOWER_BIND"] == "127.0.0.1", "Flower must not be exposed by default"


@pytest.mark.process
def test_expose_override_publishes_redis(tmp_path):
    env_file, _ = write_env(tmp_path, REDIS_BIND="10.1.2.3")
    services = compose_config(env_file, COMPOSE, EXPOSE)["services"]
    assert ports(services["redis"]) == [("10.1.2.3", "6379", "6379")]
    assert ports(services["worker"]) == []


@pytest.mark.process
def test_worker_on_another_machine_points_at_redis_host(tmp_path):
    # README: an extra machine runs `docker compose up --no-deps worker` with REDIS_HOST in .env.
    env_file, values = write_env(tmp_path, REDIS_HOST="trainer-host")
    worker = compose_config(env_file)["services"]["worker"]
    url = f"redis://:{values['REDIS_PASSWORD']}@trainer-host:6379/0"
    assert worker["environment"]["RLFARM_REDIS_URL"] == url


def check_secrets(service: dict, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Runs the check-secrets service's script as its container would (its sh -c, its environment)."""
    assert service["command"][:2] == ["sh", "-c"]
    script = service["command"][2].replace("$$", "$")  # Compose v1's config keeps the $$ escape
    return subprocess.run(["sh", "-c", script], env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True)


@pytest.mark.process
def test_placeholder_secrets_stop_compose_up_before_anything_starts(tmp_path):
    """`docker compose up` with .env.example copied unchanged starts nothing: check-secrets runs first,
    Redis waits for it to succeed and every rlfarm service waits for a healthy Redis."""
    example = env_example()
    env_file, _ = write_env(
        tmp_path, REDIS_PASSWORD=example["REDIS_PASSWORD"], FLOWER_BASIC_AUTH=example["FLOWER_BASIC_AUTH"]
    )
    services = compose_config(env_file)["services"]
    check = services["check-secrets"]
    assert services["redis"]["depends_on"]["check-secrets"]["condition"] == "service_completed_successfully"
    for name in ("worker", "trainer", "flower"):
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert ports(check) == [] and check["network_mode"] == "none" and check["restart"] == "no"
    assert set(check["environment"]) == {"REDIS_PASSWORD", "FLOWER_BASIC_AUTH", "RLFARM_SECRET"}

    # .env.example untouched: refused in one line naming the variable, and no value is printed.
    proc = check_secrets(check, check["environment"])
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "REDIS_PASSWORD" in proc.stderr, proc.stderr
    assert example["REDIS_PASSWORD"] not in proc.stderr
    proc = check_secrets(check, {**check["environment"], "REDIS_PASSWORD": secrets.token_hex(16)})
    assert proc.returncode == 1 and "FLOWER_BASIC_AUTH" in proc.stderr, proc.stderr
    assert example["FLOWER_BASIC_AUTH"].partition(":")[2] not in proc.stderr

    # Real secrets (as the other tests write them): accepted.
    env_file, values = write_env(tmp_path)
    good = compose_config(env_file)["services"]["check-secrets"]
    assert good["environment"]["REDIS_PASSWORD"] == values["REDIS_PASSWORD"]
    assert values["REDIS_PASSWORD"] not in " ".join(good["command"]), "password on the command line"
    proc = check_secrets(good, good["environment"])
    assert proc.returncode == 0, proc.stderr

    ok = good["environment"]
    refused = {  # variable named in the line -> environment
        "REDIS_PASSWORD": {**ok, "REDIS_PASSWORD": "abc123"},  # shorter than 12
        "RLFARM_SECRET": {**ok, "RLFARM_SECRET": "CHANGE-ME-" + "x" * 20},  # optional, but no placeholder
        "FLOWER_BASIC_AUTH": {**ok, "FLOWER_BASIC_AUTH": f"{ok['FLOWER_BASIC_AUTH']},bob:change-me-later"},
    }
    for name, env in refused.items():
        proc = check_secrets(good, env)
        assert proc.returncode == 1 and name in proc.stderr, (name, proc.stderr)
    for value in ("admin", "admin:short", ":" + secrets.token_hex(8)):  # no password, short, no user
        proc = check_secrets(good, {**ok, "FLOWER_BASIC_AUTH": value})
        assert proc.returncode == 1 and "FLOWER_BASIC_AUTH" in proc.stderr, (value, proc.stderr)
    accepted = [
        {**ok, "RLFARM_SECRET": secrets.token_hex(32)},
        {**ok, "FLOWER_BASIC_AUTH": f"{ok['FLOWER_BASIC_AUTH']},bob:*{secrets.token_hex(8)}*"},
    ]
    for env in accepted:
        proc = check_secrets(good, env)
        assert proc.returncode == 0, proc.stderr


@pytest.mark.process
def test_compose_v2_resolves_the_files_too(tmp_path):
    """The deploy docs say `docker compose` (v2); where it is installed it must agree with v1."""
    try:
        v2 = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no docker CLI")
    if v2.returncode != 0:
        pytest.skip("Compose v2 (`docker compose`) not installed (Debian 12 packages only v1)")
    env_file, values = write_env(tmp_path)
    for files in ((COMPOSE,), (COMPOSE, EXPOSE), (COMPOSE, SENTINEL)):
        cmd = ["docker", "compose", *[a for f in files for a in ("-f", str(f))], "--env-file", str(env_file)]
        proc = subprocess.run([*cmd, "config"], capture_output=True, text=True, env=compose_env(), cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        services = yaml.safe_load(proc.stdout)["services"]
        assert services["redis"]["depends_on"]["check-secrets"]["condition"] == "service_completed_successfully"
        assert services["check-secrets"]["environment"]["REDIS_PASSWORD"] == values["REDIS_PASSWORD"]
    env_file, _ = write_env(tmp_path, drop=("REDIS_PASSWORD",))
    proc = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "--env-file", str(env_file), "config"],
        capture_output=True,
        text=True,
        env=compose_env(),
        cwd=ROOT,
    )
    assert proc.returncode != 0 and "set REDIS_PASSWORD in .env" in proc.stderr


def test_dockerfile_matches_the_package():
    dockerfile = (ROOT / "Dockerfile").read_text()
    pin = re.search(r"torch==([\w.]+)", (ROOT / "setup.cfg").read_text()).group(1)
    torch_line = next(line for line in dockerfile.splitlines() if "pip install torch" in line)
    assert f"torch=={pin}" in torch_line and "download.pytorch.org/whl/cpu" in torch_line
    # worker, trainer and flower share the image: the trainer's extras and Flower are in it
    assert re.search(r'^RUN pip install "\.\[all\]"', dockerfile, re.M)
    assert re.search(r"^FROM python:3\.11-slim", dockerfile, re.M)
    user = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)
    assert user and user[-1] not in ("root", "0")
    assert not re.search(
        r"PASSWORD|BASIC_AUTH|redis://",
        dockerfile.split("CMD")[0].replace("# No secrets here: RLFARM_REDIS_URL and FLOWER_BASIC_AUTH", ""),
    ), "secret baked into the image"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".env", ".env.*", ".venv", ".git", "runs"} <= set(ignored), "secrets must never enter an image"


def test_docs_spell_compose_one_way():
    """Deploy commands say `docker compose` (Compose v2) everywhere; `docker-compose` is only named, as
    Debian's package the test command installs (the tests resolve the files with it: Debian 12 has no v2)."""
    texts = [
        ROOT / "README.md",
        ROOT / ".env.example",
        *(ROOT / "docs").glob("*.md"),
        *ROOT.glob("docker-compose*.yml"),
    ]
    v1_command = re.compile(
        r"docker-compose\s+(-f|-p|--env-file|up|down|logs|ps|config|build|stop|start|"
        r"restart|exec|run|pull|rm|kill)\b"
    )
    for path in texts:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not v1_command.search(line), f"{path.name}:{n} runs docker-compose: {line}"
    assert "docker compose up" in (ROOT / "README.md").read_text()


@pytest.mark.process
def test_env_is_git_ignored_and_its_template_tracked():
    def git(*args: str) -> int:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True).returncode

    if git("rev-parse", "--is-inside-work-tree") != 0:
        pytest.skip("not a git checkout")
    assert git("check-ignore", "-q", ".env") == 0, ".env holds the secrets: .gitignore must list it"
    assert git("check-ignore", "-q", ".env.production") == 0
    assert git("check-ignore", "-q", ".env.example") == 1, ".env.example must not be ignored"
    assert git("ls-files", "--error-unmatch", ".env.example") == 0, ".env.example must be tracked"


# ---- the services, run as local processes ------------------------------------------------------------
@pytest.mark.process
def test_sentinel_override_agrees_with_itself_and_its_sentinel_watches_the_master(tmp_path):
    """docker-compose.sentinel.yml: every rlfarm service connects through the three sentinels, under
    the name they monitor the master by, with its password; the replica follows `redis`; and the
    sentinel's start-up script, run here with its redis-sentinel, watches a real master with that
    password (host `redis` mapped to 127.0.0.1 and a free port)."""
    from rlfarm.farm.redis_url import parse_sentinel

    from .sentinel import sentinel_command

    env_file, values = write_env(tmp_path)
    password = values["REDIS_PASSWORD"]
    services = compose_config(env_file, COMPOSE, SENTINEL)["services"]
    assert {"redis", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"} <= set(services)
    assert arg_after(services["redis"]["command"], "--masterauth") == password  # if it becomes a replica
    replica = services["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1 : replica.index("--replicaof") + 3] == ["redis", "6379"]
    assert arg_after(replica, "--masterauth") == password and arg_after(replica, "--requirepass") == password
    assert ports(services["redis-replica"]) == []
    scripts = [services[f"sentinel-{i}"]["command"][-1] for i in (1, 2, 3)]
    assert len(set(scripts)) == 1 and password not in scripts[0], "the password belongs in the environment"
    monitor = re.search(r"sentinel monitor (\S+) redis 6379 (\d)", scripts[0])
    assert monitor and int(monitor.group(2)) == 2, "a quorum of 2 of the 3 sentinels"
    for name in ("worker", "trainer", "flower"):
        target = parse_sentinel(services[name]["environment"]["RLFARM_REDIS_URL"])
        assert target.sentinels == tuple((f"sentinel-{i}", 26379) for i in (1, 2, 3))
        assert target.master_name == monitor.group(1) and target.password == password
        assert set(services[name]["depends_on"]) >= {"redis", "sentinel-1", "sentinel-2", "sentinel-3"}

    server, _ = _redis_binaries()
    master_port, sentinel_port = free_port(), free_port()
    conf = tmp_path / "sentinel.conf"
    script = (
        scripts[0]
        .replace("$$", "$")
        .replace("port 26379", f"port {sentinel_port}")
        .replace("redis 6379", f"127.0.0.1 {master_port}")
        .replace("/tmp/sentinel.conf", str(conf))
        .replace("exec redis-sentinel", "exec " + " ".join(sentinel_command()))
    )
    master = subprocess.Popen(
        [server, "--port", str(master_port), "--bind", "127.0.0.1", "--save", "", "--requirepass", password],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    sentinel = subprocess.Popen(
        ["sh", "-c", script],
        env={"PATH": os.environ["PATH"], "REDIS_PASSWORD": password},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        watcher = redis.Redis(port=sentinel_port, socket_connect_timeout=1, decode_responses=True)

        def master_seen_up() -> bool:
            try:
                state = watcher.execute_command("SENTINEL", "MASTER", monitor.group(1))
            except redis.RedisError:
                return False
            flags = dict(zip(state[::2], state[1::2])) if isinstance(state, list) else state
            # authenticated: the master answers its pings, so it has a role and no down flag
            return (
                flags["flags"] == "master"
                and flags.get("role-reported") == "master"
                and int(flags.get("last-ok-ping-reply", 10**6)) < 2000
            )

        poll(master_seen_up, "the compose sentinel watching the master with its password", sentinel)
    finally:
        stop_process_group(sentinel, grace=5.0)
        stop_process_group(master, grace=5.0)


def _redis_binaries() -> tuple[str, str]:
    server = "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else find_redis_server()
    cli = shutil.which("redis-cli") or str(Path(server).with_name("redis-cli"))
    if not os.access(cli, os.X_OK):
        pytest.fail("redis-cli not found: install Debian's redis-server package (.ci/run does)")
    return server, cli


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _http_status(url: str, auth: str | None = None) -> int:
    try:
        with urllib.request.urlopen(http_request(url, auth), timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


@pytest.mark.farm
def test_compose_services_run_as_local_processes(tmp_path):
    env_file, values = write_env(tmp_path, WORKER_CONCURRENCY="1", REDIS_MAXMEMORY="64mb")
    services = compose_config(env_file)["services"]
    password = values["REDIS_PASSWORD"]
    port = free_port()
    local_url = f"redis://:{password}@127.0.0.1:{port}/0"
    venv_bin = str(Path(sys.executable).parent)
    base_env = {**compose_env(), **WORKER_ENV, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "")}

    def service_env(name: str) -> dict[str, str]:
        # Host `redis` of the compose network is this test's redis-server.
        env = {
            k: str(v).replace("@redis:6379/", f"@127.0.0.1:{port}/")
            for k, v in services[name].get("environment", {}).items()
        }
        return {**base_env, **env}

    procs: list[tuple[str, subprocess.Popen, Path]] = []
    pids: list[int] = []

    def start(name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = tmp_path / f"{name}.log"
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=open(log, "wb"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=tmp_path,
        )
        procs.append((name, proc, log))
        pids.append(proc.pid)
        return proc

    server, cli = _redis_binaries()
    data = tmp_path / "redis-data"
    data.mkdir()
    try:
        # redis: its command as resolved, plus where to listen and write locally.
        cmd = services["redis"]["command"]
        assert cmd[0] == "redis-server"
        redis_proc = start(
            "redis",
            [server, *cmd[1:], "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)],
            service_env("redis"),
        )
        client = redis.Redis.from_url(local_url)
        poll(lambda: _ping(client), "redis-server", redis_proc, tmp_path / "redis.log")
        config = client.config_get("*")  # redis-py decodes CONFIG GET replies
        assert config["appendonly"] == "yes" and config["appendfsync"] == "everysec"
        assert config["maxmemory-policy"] == "noeviction"
        assert int(config["maxmemory"]) == 64 * 1024**2
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()

        # healthcheck: healthy with the service's REDISCLI_AUTH, unhealthy with a wrong one.
        test = services["redis"]["healthcheck"]["test"]
        assert test[:2] == ["CMD", "redis-cli"]
        check = [cli, "-h", "127.0.0.1", "-p", str(port), *test[2:]]
        ok = subprocess.run(check, env=service_env("redis"), capture_output=True, text=True)
        assert ok.returncode == 0 and "PONG" in ok.stdout
        bad = subprocess.run(
            check, env={**service_env("redis"), "REDISCLI_AUTH": "wrong"}, capture_output=True, text=True
        )
        assert bad.returncode != 0, "the healthcheck passes without the right password"

        # worker
        cmd = services["worker"]["command"]
        worker = start("worker", cmd, service_env("worker"))
        app = make_app(local_url)
        try:
            replies = poll(lambda: app.control.ping(timeout=0.5), "worker answers", worker, tmp_path / "worker.log")
        finally:
            app.close()
        assert len(replies) == 1
        pids += _children(worker.pid)

        # flower: basic auth from its environment, its port moved to a free one.
        cmd = services["flower"]["command"]
        assert "--port=5555" in cmd
        flower_port = free_port()
        flower = start(
            "flower",
            [a if a != "--port=5555" else f"--port={flower_port}" for a in cmd] + ["--address=127.0.0.1"],
            service_env("flower"),
        )
        base = f"http://127.0.0.1:{flower_port}"
        poll(
            lambda: _http_status(f"{base}/workers") == 401,
            "flower refuses anonymous requests",
            flower,
            tmp_path / "flower.log",
        )
        auth = values["FLOWER_BASIC_AUTH"]
        assert _http_status(f"{base}/workers", "admin:wrong") == 401
        assert _http_status(f"{base}/workers", auth) == 200

        # trainer: its command with a short run, the /runs volume mapped to a local directory.
        cmd = services["trainer"]["command"]
        logdir = arg_after(cmd, "--logdir")
        runs = tmp_path / "runs"
        argv = [str(runs) if a == logdir else a for a in cmd]
        argv += ["--total-steps", "3000", "--set", "eval.interval=0", "--device", "cpu"]
        trainer = subprocess.Popen(
            argv,
            env=service_env("trainer"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            cwd=tmp_path,
        )
        pids.append(trainer.pid)
        output, _ = trainer.communicate()
        assert trainer.returncode == 0, output[-3000:]
        summary = json.loads((runs / arg_after(cmd, "--run-id") / "summary.json").read_text())
        assert summary["env_steps"] >= 3000
        assert "policy_lag_histogram" in summary  # it ran in ASYNC mode

        # A restarted trainer container runs the same command: it must continue its run, not fail
        # on it (restart: on-failure would otherwise loop).
        again = subprocess.Popen(
            argv,
            env=service_env("trainer"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            cwd=tmp_path,
        )
        pids.append(again.pid)
        output_again, _ = again.communicate()
        assert again.returncode == 0, output_again[-3000:]
        assert "resuming" in output_again
        output += output_again

        # Flower saw the worker through the broker URL from its environment.
        def flower_workers():
            with urllib.request.urlopen(http_request(f"{base}/api/workers?refresh=1", auth), timeout=10) as response:
                return json.load(response)

        assert len(poll(flower_workers, "flower lists the worker")) == 1

        assert password not in output
    finally:
        # As `docker compose stop` does: SIGTERM, then a grace period (warm shutdown for the worker).
        for _name, proc, _ in reversed(procs):
            stop_process_group(proc, grace=60.0)

    for name, proc, log in procs:
        assert proc.returncode == 0, f"{name} did not stop cleanly on SIGTERM ({proc.returncode})"
        if name != "redis":
            assert password not in log.read_text(errors="replace"), f"password in {name}'s output"
    assert any(data.iterdir()), "Redis wrote no append-only file"
    poll(lambda: not any(pid_alive(p) for p in pids), "all started processes gone")


def _ping(client: redis.Redis) -> bool:
    try:
        return client.ping()
    except redis.ConnectionError:
        return False

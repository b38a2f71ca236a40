"""rlfarm.farm.find: one way to find the farm, in one order, with the secret that goes with it (unit:
the up farm's state file and runs' cluster.json are files here, and Redis answers through a stand-in)."""

from __future__ import annotations

import json
import os

import pytest

from rlfarm.farm import find as F

UP_URL = "redis://:pw-of-up@127.0.0.1:41001/0"
UP_SECRET = "a" * 64


class Answering:
    """A redis client stand-in: the URLs in `live` answer PING, others raise."""

    live: set[str] = set()

    def __init__(self, url: str):
        self.url = url

    def ping(self):
        import redis

        if self.url not in self.live:
            raise redis.ConnectionError("refused")
        return True

    def close(self):
        pass


def dead_pid() -> int:
    from rlfarm.farm.find import alive

    pid = 4_000_000
    while alive(pid):
        pid += 1
    return pid


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A tmp RLFARM_HOME, no RLFARM_REDIS_URL or RLFARM_SECRET, and Redis answering only for `Answering.live`."""
    monkeypatch.setenv("RLFARM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RLFARM_REDIS_URL", raising=False)
    monkeypatch.delenv("RLFARM_SECRET", raising=False)
    monkeypatch.setattr("rlfarm.farm.redis_url.client", lambda url, **kw: Answering(url))
    monkeypatch.setattr(Answering, "live", set())
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def start_up_farm(home, pids=None):
    """What `rlfarm up` leaves: its state file, its processes alive (this one stands in), Redis answering."""
    (home / "local-farm.json").write_text(
        json.dumps({"redis_url": UP_URL, "pids": pids or [os.getpid()], "workers": 3, "secret": UP_SECRET})
    )
    Answering.live.add(UP_URL)


def embedded_run(tmp_path, run_id: str, url: str, alive: bool = True, secret: str | None = None):
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True)
    state = {"redis_url": url, "pids": [os.getpid() if alive else dead_pid(), os.getpid()]}
    if secret:
        state["secret"] = secret
    (run_dir / "cluster.json").write_text(json.dumps(state))
    Answering.live.add(url)
    return run_dir


def test_the_order_is_redis_then_the_variable_then_the_up_farm_then_a_run_s_embedded_redis(home, tmp_path, monkeypatch):
    run_dir = embedded_run(tmp_path, "r1", "redis://127.0.0.1:42002/0")
    # nothing up, no run named: no farm (train starts the embedded default)
    assert F.find_farm(None) == F.Farm(None)
    # a run named whose embedded Redis lives
    farm = F.find_farm(None, run_dir)
    assert (farm.url, farm.source, farm.secret, farm.up) == (
        "redis://127.0.0.1:42002/0",
        "run r1's embedded Redis",
        None,
        False,
    )
    # the up farm comes before it, with its secret
    start_up_farm(home)
    farm = F.find_farm(None, run_dir)
    assert (farm.url, farm.secret, farm.source, farm.local_workers) == (UP_URL, UP_SECRET, F.UP_FARM, 3)
    # RLFARM_REDIS_URL before the up farm
    monkeypatch.setenv("RLFARM_REDIS_URL", "redis://elsewhere:6379/0")
    farm = F.find_farm(None, run_dir)
    assert (farm.url, farm.source, farm.secret, farm.up) == (
        "redis://elsewhere:6379/0",
        "RLFARM_REDIS_URL",
        None,
        False,
    )
    # --redis before everything
    farm = F.find_farm("redis://given:6379/1", run_dir)
    assert (farm.url, farm.source, farm.secret) == ("redis://given:6379/1", "--redis", None)
    # the API passes environ={}: the variable is not read
    assert F.find_farm(None, environ={}).source == F.UP_FARM


def test_the_up_farm_s_url_given_by_hand_brings_its_secret(home, monkeypatch):
    start_up_farm(home)
    for url in (UP_URL, "redis://:pw-of-up@localhost:41001", "redis://:pw-of-up@127.0.0.1:41001/0?x=1"):
        farm = F.find_farm(url)
        assert (farm.secret, farm.source, farm.local_workers) == (UP_SECRET, f"--redis ({F.UP_FARM})", 3), url
    monkeypatch.setenv("RLFARM_REDIS_URL", UP_URL)
    assert F.find_farm(None).source == f"RLFARM_REDIS_URL ({F.UP_FARM})"
    # another port, another db or another password is another farm: no secret of the up farm's given away
    for url in (
        "redis://:pw-of-up@127.0.0.1:41002/0",
        "redis://:pw-of-up@127.0.0.1:41001/1",
        "redis://:other@127.0.0.1:41001/0",
        "redis://10.0.0.5:41001/0",
        "unix:///tmp/r.sock",
    ):
        farm = F.find_farm(url)
        assert (farm.secret, farm.source, farm.up) == (None, "--redis", False), url


def test_an_up_farm_or_embedded_redis_that_is_gone_is_not_found(home, tmp_path):
    start_up_farm(home, pids=[dead_pid()])  # its processes are gone (the file outlived them)
    gone = embedded_run(tmp_path, "gone", "redis://127.0.0.1:42003/0", alive=False)
    assert F.find_farm(None, gone) == F.Farm(None)
    assert F.find_farm(UP_URL).secret is None  # a stale state file gives no secret away
    silent = embedded_run(tmp_path, "silent", "redis://127.0.0.1:42004/0")
    Answering.live.discard("redis://127.0.0.1:42004/0")  # its pid lives (reused), its Redis does not answer
    assert F.find_farm(None, silent) == F.Farm(None)
    (tmp_path / "runs" / "broken").mkdir()
    (tmp_path / "runs" / "broken" / "cluster.json").write_text("{not json")
    assert F.find_farm(None, tmp_path / "runs" / "broken") == F.Farm(None)
    assert F.find_farm(None, tmp_path / "runs" / "never-ran") == F.Farm(None)


def test_a_cluster_json_with_a_secret_brings_it(home, tmp_path):
    run_dir = embedded_run(tmp_path, "signed", "redis://127.0.0.1:42005/0", secret="b" * 64)
    assert F.find_farm(None, run_dir).secret == "b" * 64


def test_no_farm_is_one_line_saying_what_was_tried(home, tmp_path):
    assert F.find_farm(None).url is None
    assert F.not_found(None) == (
        "no farm found: no --redis, no RLFARM_REDIS_URL, no `rlfarm up` farm (start "
        "one with `rlfarm up`, or give --redis URL)"
    )
    assert F.find_farm(None, tmp_path / "runs" / "r9").url is None
    said = F.not_found(tmp_path / "runs" / "r9")
    assert "no live embedded Redis of run r9" in said and "\n" not in said


def test_the_farm_s_secret_goes_into_the_environment_and_a_different_one_of_the_user_s_is_said(home):
    farm = F.Farm(UP_URL, UP_SECRET, F.UP_FARM, 3)
    env: dict[str, str] = {}
    assert F.use_secret(farm, env) is None and env == {"RLFARM_SECRET": UP_SECRET}
    env = {"RLFARM_SECRET": UP_SECRET}
    assert F.use_secret(farm, env) is None
    env = {"RLFARM_SECRET": "mine"}
    warning = F.use_secret(farm, env)
    assert env["RLFARM_SECRET"] == UP_SECRET
    assert warning == (
        "your RLFARM_SECRET is not the secret of the rlfarm up farm, which its workers sign "
        "and check with: using the farm's"
    )
    env = {"RLFARM_SECRET": "mine"}  # a farm whose secret is not known here: the user's stays
    assert F.use_secret(F.Farm("redis://h:6379/0", None, "--redis"), env) is None and env == {"RLFARM_SECRET": "mine"}
    assert F.describe(farm) == "the rlfarm up farm, redis://:***@127.0.0.1:41001/0"


def test_a_sweep_names_the_farm_its_study_is_on(home):
    """`rlfarm sweep` on an `rlfarm up` farm said its study was "created in the embedded Redis"."""
    from rlfarm.tune.study import study_place

    start_up_farm(home)
    up = study_place(F.find_farm(None), "s1")
    assert (
        up
        == (
            "in the Redis of the rlfarm up farm (redis://:***@127.0.0.1:41001/0): --resume s1 continues "
            "it while the farm is up"
        )
        and "embedded" not in up
    )
    assert study_place(F.find_farm(UP_URL), "s1") == up  # its URL given by hand: the same farm
    given = study_place(F.find_farm("redis://:pw@10.0.0.5:6379/0"), "s1")
    assert given == (
        "in Redis at redis://:***@10.0.0.5:6379/0 (from --redis): more machines can join with the "
        "same command and --resume s1"
    )
    assert "embedded Redis" in study_place(F.Farm(None), "s1")

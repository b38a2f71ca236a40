"""The trainer's ingest thread (rlfarm.trainer.ingest): results taken out of a real redis-server and
decoded beside the main thread, handed over in push order, never out of the watchdog's sight, bounded
by its prefetch, forged ones reported, and Redis's failure raised in the main thread."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
import redis

from rlfarm.core import codec, signing
from rlfarm.core.protocol import Result
from rlfarm.errors import RedisUnavailable
from rlfarm.farm import keys
from rlfarm.farm.connection import connect
from rlfarm.farm.outage import OutageRetry, resilient_client
from rlfarm.local.cluster import LocalCluster
from rlfarm.trainer.ingest import Ingest, keep_freed_memory

from .conftest import read_summary, run_cli

pytestmark = pytest.mark.farm

SECRET = b"ingest-test-secret-0123456789abcdef"


def sealed(run: str, iteration: int, secret: bytes = SECRET) -> bytes:
    """A rollout result as a worker pushes it: msgpack with a (compressible) array, signed."""
    frames = np.full((16, 84, 84), iteration % 251, dtype=np.uint8)
    result = Result("rollout", iteration, 0, version=0, worker="w@test", rollout={"obs": frames})
    return signing.seal_result(run, codec.pack(result.to_message(), compress="zstd"), secret)


def wait_for(predicate, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.01)


@pytest.fixture
def run(redis_only, request):
    client = connect(redis_only.redis_url)
    run_id = f"ingest-{request.node.name}"
    yield client, run_id
    doomed = list(client.scan_iter(match=keys.run_pattern(run_id)))
    if doomed:
        client.delete(*doomed)
    client.close()


def test_results_arrive_decoded_in_push_order_and_are_always_in_one_of_the_two_lists(run):
    client, run_id = run
    ingest = Ingest(client, run_id, SECRET, prefetch=3)
    try:
        pushed, got = 40, []
        for i in range(pushed):
            client.rpush(keys.results(run_id), sealed(run_id, i))
            if i % 3 == 0:  # the main thread takes some while more arrive, as a trainer between minibatches
                item = ingest.take(timeout=5.0)
                got.append(item)
            pipe = client.pipeline(transaction=True)  # both at one instant, to count exactly
            pipe.llen(keys.results(run_id))
            pipe.llen(keys.taken(run_id))
            waiting, taken = pipe.execute()
            # Every result not yet taken in is in one of the lists (the watchdog reads `results`
            # first: one moving between its two reads is counted twice, never missed).
            assert waiting + taken == i + 1 - len(got)
            assert taken <= 3  # the prefetch bound: the rest wait in Redis
        while len(got) < pushed:
            got.append(ingest.take(timeout=5.0))
    finally:
        ingest.close()
    assert [what for what, _, _ in got] == ["result"] * pushed
    assert [r.iteration for _, r, _ in got] == list(range(pushed))
    assert all(r.rollout["obs"][0, 0, 0] == r.iteration % 251 for _, r, _ in got)
    assert all(cpu >= 0 for _, _, cpu in got)
    assert client.llen(keys.taken(run_id)) == 0 and client.llen(keys.results(run_id)) == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("rlfarm-ingest")]


def test_what_a_dead_trainer_leaves_in_taken_expires_by_itself(run):
    """Each take renews `taken`'s expiry, so what a trainer that died held there goes by itself."""
    client, run_id = run
    for i in range(2):
        client.rpush(keys.results(run_id), sealed(run_id, i))
    ingest = Ingest(client, run_id, SECRET, prefetch=2)
    try:
        assert ingest.take(timeout=5.0)[1].iteration == 0
        wait_for(lambda: client.llen(keys.taken(run_id)) == 1)
        assert 0 < client.ttl(keys.taken(run_id)) <= keys.RESULTS_TTL
    finally:
        ingest.close()


def test_without_a_secret_unsigned_and_signed_results_are_taken_in_and_an_unreadable_one_raised(run):
    client, run_id = run
    client.rpush(keys.results(run_id), sealed(run_id, 0, secret=None), sealed(run_id, 1))
    client.rpush(keys.results(run_id), signing.seal_result(run_id, b"\xc1 not msgpack", None))
    ingest = Ingest(client, run_id, None)
    try:
        assert [ingest.take(timeout=5.0)[1].iteration for _ in range(2)] == [0, 1]
        with pytest.raises(codec.CodecError):  # raised in the main thread, as the inline path raises it
            ingest.take(timeout=5.0)
    finally:
        ingest.close()


def test_a_learner_behind_leaves_results_in_redis(run):
    client, run_id = run
    for i in range(10):
        client.rpush(keys.results(run_id), sealed(run_id, i))
    ingest = Ingest(client, run_id, SECRET, prefetch=4)
    try:
        wait_for(lambda: client.llen(keys.taken(run_id)) == 4)
        assert client.llen(keys.results(run_id)) == 6
        for i in range(3):
            assert ingest.take(timeout=5.0)[1].iteration == i
            wait_for(lambda i=i: client.llen(keys.results(run_id)) == 5 - i)  # one more into the room made
            assert client.llen(keys.taken(run_id)) == 4
    finally:
        ingest.close()


def test_a_forged_result_is_handed_over_as_forged_and_the_next_still_arrives(run):
    client, run_id = run
    client.rpush(keys.results(run_id), sealed(run_id, 0, secret=b"another-farms-secret-0123456789ab"))
    client.rpush(keys.results(run_id), sealed(run_id, 1))
    ingest = Ingest(client, run_id, SECRET)
    try:
        what, raw, exc = ingest.take(timeout=5.0)
        assert (
            what == "forged"
            and isinstance(exc, signing.SignatureError)
            and raw.endswith(
                codec.pack(
                    Result(
                        "rollout",
                        0,
                        0,
                        version=0,
                        worker="w@test",
                        rollout={"obs": np.full((16, 84, 84), 0, dtype=np.uint8)},
                    ).to_message(),
                    compress="zstd",
                )
            )
        )
        what, result, _ = ingest.take(timeout=5.0)
        assert what == "result" and result.iteration == 1
    finally:
        ingest.close()


def test_what_a_dead_trainer_left_taken_is_cleared_when_the_next_starts(run):
    client, run_id = run
    client.rpush(keys.taken(run_id), b"left by a trainer that died")
    ingest = Ingest(client, run_id, SECRET)
    try:
        assert client.llen(keys.taken(run_id)) == 0
    finally:
        ingest.close()


def test_redis_gone_past_the_outage_limit_is_raised_in_the_main_thread(tmp_path):
    with LocalCluster(workers=0, name="rlfarm-test-ingest-outage", log_dir=tmp_path) as cluster:
        client = resilient_client(cluster.redis_url, OutageRetry(1.0, where="test Redis"))
        ingest = Ingest(client, "outage", SECRET)
        try:
            cluster.stop_redis()
            with pytest.raises((RedisUnavailable, redis.ConnectionError)):
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    ingest.take(timeout=0.5)
        finally:
            ingest.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("rlfarm-ingest")]


def test_freed_result_memory_is_kept_for_reuse_on_glibc():
    assert keep_freed_memory()


@pytest.mark.parametrize("ingest", ["thread", "inline"])
def test_an_async_run_takes_every_result_in_and_resends_none(farm, tmp_path, ingest):
    """APPO on the farm, its results taken in by the thread or between the learner's minibatches: no
    task is taken for lost (a result the thread holds is counted by the watchdog), nothing is
    received twice but a straggler's backup, and the run's result lists are gone when it ends."""
    run_id = f"ingest-run-{ingest}"
    result = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        "--preset",
        "cartpole-appo",
        "--total-steps",
        "12000",
        "--set",
        "eval.interval=0",
        "--set",
        "target_return=inf",
        "--set",
        f"async.ingest={ingest}",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = read_summary(tmp_path / run_id)
    assert summary["env_steps"] >= 12000
    # What taking a result for lost would count; a straggler's backup (a slow machine) may add a
    # duplicate, but nothing else may.
    assert summary["faults"]["leases_expired"] == summary["faults"]["messages_lost"] == 0
    assert summary["duplicates"] <= summary["faults"]["stragglers"]
    assert summary["receive_cpu_seconds"] > 0
    client = redis.Redis.from_url(farm.redis_url)
    assert not client.exists(keys.taken(run_id), keys.results(run_id))


def test_a_forged_taken_list_is_repaired_by_the_trainers_guard_and_results_still_arrive(run, redis_only):
    """`taken` set to a string by someone without the secret: the thread's BLMOVE answers WRONGTYPE, and
    the trainer's client (rlfarm.farm.guard) deletes the key, says so and moves the result again."""
    from rlfarm.farm.guard import guarded_client

    plain, run_id = run
    said: list[str] = []
    client, _ = guarded_client(redis_only.redis_url, run_id, 5.0, where="Redis", warn=said.append, refused=said.append)
    ingest = Ingest(client, run_id, SECRET)
    try:
        plain.set(keys.taken(run_id), "forged")
        plain.rpush(keys.results(run_id), sealed(run_id, 7))
        what, result, _ = ingest.take(timeout=20.0)
        assert what == "result" and result.iteration == 7
        assert any(keys.taken(run_id) in line for line in said), said
        assert plain.type(keys.taken(run_id)) in (b"list", b"none")
    finally:
        ingest.close()
        client.close()


def test_an_async_trainer_touches_the_run_only_once_it_holds_it(run, redis_only, tmp_path):
    """Built but not training (a second trainer of a run in use is refused only in `train`), an
    ASYNC trainer starts no ingest thread and leaves the run's `taken` list, which the run's own
    trainer counts on, as it is."""
    from rlfarm.api import make_config
    from rlfarm.trainer import make_trainer

    client, run_id = run
    client.rpush(keys.taken(run_id), b"a result the run's trainer is decoding")
    cfg = make_config("cartpole-appo", run_id=run_id, logdir=str(tmp_path))
    trainer = make_trainer(cfg, redis_only.redis_url, tmp_path / run_id)
    try:
        assert trainer.channel.ingest is None
        assert not [t for t in threading.enumerate() if t.name.startswith("rlfarm-ingest")]
        assert client.llen(keys.taken(run_id)) == 1
    finally:
        trainer.channel.close()


class ReplyCutter:
    """A TCP proxy in front of Redis on 127.0.0.1 that, armed, cuts the client's connection once right
    after Redis has run a BLMOVE that moved a result: the command ran, its reply never arrives."""

    def __init__(self, port: int, skip: int = 0):
        import socket

        self.target = port
        self.skip = skip  # moved results whose replies pass before the one cut
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.armed, self.cut = threading.Event(), threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, skip: int = 0) -> None:
        """Cut once more, after `skip` moved results' replies."""
        self.skip = skip
        self.cut.clear()
        self.armed.set()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                near, _ = self.server.accept()
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", self.target))
            pending = threading.Event()  # a BLMOVE went to Redis on this connection, its reply not yet back
            threading.Thread(target=self._pump, args=(near, far, pending, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(far, near, pending, False), daemon=True).start()

    def _pump(self, source, sink, pending: threading.Event, to_redis: bool) -> None:
        import socket

        try:
            while data := source.recv(65536):
                if to_redis and re.match(rb"\*\d+\r\n\$6\r\nBLMOVE\r\n", data, re.IGNORECASE):  # the command's name
                    pending.set()
                elif not to_redis and pending.is_set():
                    pending.clear()
                    nil = data.startswith((b"*-1", b"$-1", b"_"))
                    if not nil and self.armed.is_set() and not self.cut.is_set():
                        if self.skip:
                            self.skip -= 1
                        else:
                            self.cut.set()  # Redis moved a result; its reply is dropped with the connection
                            raise OSError("cut")
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):  # shut down, not only closed: the other pump may be in recv()
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()

    def close(self) -> None:
        self.server.close()


@pytest.mark.parametrize("held", [0, 1], ids=["first", "with-one-held"])
def test_a_blmove_whose_reply_was_lost_loses_no_result_and_keeps_the_order(run, redis_only, held):
    """The connection cut after Redis ran a BLMOVE: the outage retry sends it again, which moves the
    next result, and the first stayed in `taken` unseen; trimming by position then dropped the wrong
    one from `taken`, and its task was re-sent as lost (issue 50). Now every result arrives once, in
    order, and neither list keeps any."""
    client, run_id = run
    for i in range(4):
        client.rpush(keys.results(run_id), sealed(run_id, i))
    # `held`: results the thread holds, not yet taken in, when the reply is cut (`taken` starts with them)
    proxy = ReplyCutter(int(redis_only.redis_url.rsplit(":", 1)[1].split("/")[0]), skip=held)
    through = resilient_client(f"redis://127.0.0.1:{proxy.port}/0", OutageRetry(30.0, where="test Redis"))
    proxy.armed.set()
    ingest = Ingest(through, run_id, SECRET, prefetch=2)
    try:
        # Nothing taken in before the thread has handed over what it reconciled: the held ones still
        # head `taken` when it reads it back (taken in meanwhile, a miscount could go unseen).
        wait_for(lambda: proxy.cut.is_set() and ingest._ready.qsize() >= 2)
        got = [ingest.take(timeout=10.0) for _ in range(4)]
        assert ingest.take(timeout=0.05) is None  # nothing more: none came twice
        # Again, once those were taken in: the count of held results came down with each.
        proxy.arm(skip=1)
        for i in range(4, 7):
            client.rpush(keys.results(run_id), sealed(run_id, i))
        wait_for(lambda: proxy.cut.is_set() and ingest._ready.qsize() >= 2)
        got += [ingest.take(timeout=10.0) for _ in range(3)]
    finally:
        ingest.close()
        proxy.close()
    assert [item and item[1].iteration for item in got] == [0, 1, 2, 3, 4, 5, 6]
    assert proxy.cut.is_set() and through.get_retry().failures >= 1  # the fault happened, and was retried
    assert client.llen(keys.taken(run_id)) == 0 and client.llen(keys.results(run_id)) == 0

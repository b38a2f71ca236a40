"""Guards held at their edges by unit tests, found by mutation testing (docs/reliability.md, "Mutation
testing"; scripts/mutation.sh). Each test here failed with the mutant or guard removal it names applied.

- the ingest thread's task accounting (rlfarm.trainer.ingest), against a Redis list in memory: only
  process tests held it before;
- results signing (rlfarm.core.signing.open_result) as a function, and a forged result refused by the
  ingest thread that calls it;
- the signed version field of a policy blob: a genuine blob relabelled as another version is refused
  by the store's check, not only by the codec;
- a second SIGTERM inside Celery's handler does not run it again (rlfarm.worker.hooks._term_once);
- the lag bound's "auto" size (rlfarm.trainer.asynchronous.auto_policy_lag).
"""

from __future__ import annotations

import hmac
import json
import signal
import threading

import numpy as np
import pytest

from rlfarm.core import codec, signing
from rlfarm.core.protocol import Result
from rlfarm.core.signing import SignatureError
from rlfarm.farm import keys

SECRET = b"guards-test-secret-0123456789abcdef"
RUN = "guarded"


def sealed(iteration: int, run: str = RUN, secret: bytes | None = SECRET) -> bytes:
    """A rollout result as a worker pushes it (signed with `secret`; None: unsigned)."""
    result = Result("rollout", iteration, 0, version=0, worker="w@test", rollout={"obs": np.zeros(3, np.float32)})
    return signing.seal_result(run, codec.pack(result.to_message()), secret)


class MemoryRedis:
    """The few list commands the ingest thread uses, on lists in memory; BLMOVE blocks as Redis's does."""

    def __init__(self) -> None:
        self.lists: dict[str, list[bytes]] = {}
        self.expiry: dict[str, int] = {}
        self.most_taken = 0  # the longest `taken` list seen, after each move
        self.fail: BaseException | None = None  # raised by the next BLMOVE
        self.changed = threading.Condition()

    def rpush(self, key: str, *values: bytes) -> None:
        with self.changed:
            self.lists.setdefault(key, []).extend(values)
            self.changed.notify_all()

    def delete(self, *names: str) -> None:
        with self.changed:
            for name in names:
                self.lists.pop(name, None)

    def blmove(self, source: str, destination: str, timeout: float, src: str, dest: str) -> bytes | None:
        assert (src, dest) == ("LEFT", "RIGHT")
        with self.changed:
            self.changed.wait_for(lambda: self.fail is not None or self.lists.get(source), timeout)
            if self.fail is not None:
                raise self.fail
            if not self.lists.get(source):
                return None
            value = self.lists[source].pop(0)
            self.lists.setdefault(destination, []).append(value)
            self.most_taken = max(self.most_taken, len(self.lists[destination]))
            self.changed.notify_all()
            return value

    def pipeline(self, transaction: bool = True) -> MemoryPipeline:
        return MemoryPipeline(self)

    def wait(self, predicate, what: str) -> None:
        """Until `predicate()` holds (checked on every change); a guard against a hang, not a measurement."""
        with self.changed:
            assert self.changed.wait_for(predicate, 60), what

    def get(self, key: str) -> list[bytes]:
        with self.changed:
            return list(self.lists.get(key, []))


class MemoryPipeline:
    def __init__(self, client: MemoryRedis) -> None:
        self.client = client
        self.commands: list[tuple] = []

    def ltrim(self, key: str, start: int, end: int) -> None:
        self.commands.append(("ltrim", key, start, end))

    def expire(self, key: str, seconds: int) -> None:
        self.commands.append(("expire", key, seconds))

    def execute(self) -> None:
        with self.client.changed:
            for command in self.commands:
                if command[0] == "ltrim":
                    _, key, start, end = command
                    values = self.client.lists.get(key, [])
                    stop = len(values) if end == -1 else end + 1
                    self.client.lists[key] = values[start:stop]
                else:
                    self.client.expiry[command[1]] = command[2]
            self.client.changed.notify_all()


@pytest.fixture
def ingest_of():
    from rlfarm.trainer.ingest import Ingest

    made = []

    def make(client: MemoryRedis, secret=SECRET, prefetch: int = 4) -> Ingest:
        made.append(Ingest(client, RUN, secret, prefetch=prefetch))
        return made[-1]

    yield make
    for ingest in made:
        ingest.close()


def take(ingest):
    """The next item the thread hands over: `take` blocks until it has one (60 s: a guard against a
    hang, not a measurement)."""
    item = ingest.take(60)
    assert item is not None, "the ingest thread handed nothing over"
    return item


# ---- the ingest thread's accounting ----------------------------------------------------------------


def test_what_a_dead_trainer_left_taken_is_cleared_when_the_ingest_starts(ingest_of):
    client = MemoryRedis()
    client.rpush(keys.taken(RUN), b"left by a dead trainer")
    ingest_of(client)
    assert client.get(keys.taken(RUN)) == []


def test_each_result_is_in_results_or_taken_until_taken_in_and_comes_in_push_order(ingest_of):
    client = MemoryRedis()
    pushed = [sealed(i) for i in range(3)]
    client.rpush(keys.results(RUN), *pushed)
    ingest = ingest_of(client)
    for i in range(3):
        client.wait(lambda n=3 - i: len(client.get(keys.taken(RUN))) == n, "the thread moves what is left to taken")
        assert client.get(keys.taken(RUN)) == pushed[i:]  # not yet taken in: still in Redis, in order
        kind, result, cpu = take(ingest)
        assert kind == "result" and result.iteration == i and cpu >= 0
        assert client.get(keys.taken(RUN)) == pushed[i + 1 :]  # trimmed from the left, one at a time
        assert client.expiry[keys.taken(RUN)] == keys.RESULTS_TTL
    assert ingest.take(0) is None


def test_the_thread_holds_at_most_prefetch_results(ingest_of):
    client = MemoryRedis()
    client.rpush(keys.results(RUN), *[sealed(i) for i in range(5)])
    ingest = ingest_of(client, prefetch=2)
    client.wait(lambda: len(client.get(keys.taken(RUN))) >= 2, "the thread takes its prefetch")
    assert [take(ingest)[1].iteration for _ in range(5)] == [0, 1, 2, 3, 4]
    assert client.most_taken == 2  # a learner behind leaves the rest in Redis


def test_a_forged_result_is_handed_over_as_forged_and_the_next_still_arrives(ingest_of):
    client = MemoryRedis()
    unsigned, other_run, good = sealed(0, secret=None), sealed(1, run="other"), sealed(2)
    client.rpush(keys.results(RUN), unsigned, other_run, good)
    ingest = ingest_of(client)
    for raw, why in [(unsigned, "not signed"), (other_run, "bad signature")]:
        kind, got, exc = take(ingest)
        assert kind == "forged" and got == raw and isinstance(exc, SignatureError) and why in str(exc)
    kind, result, _ = take(ingest)
    assert kind == "result" and result.iteration == 2


def test_without_a_secret_the_ingest_takes_unsigned_and_signed_results(ingest_of):
    client = MemoryRedis()
    client.rpush(keys.results(RUN), sealed(0, secret=None), sealed(1))
    ingest = ingest_of(client, secret=None)
    assert [take(ingest)[1].iteration for _ in range(2)] == [0, 1]


def test_an_unreadable_result_and_a_redis_error_are_raised_in_the_main_thread(ingest_of):
    client = MemoryRedis()
    client.rpush(keys.results(RUN), signing.seal_result(RUN, b"\xc1 not msgpack", SECRET))
    ingest = ingest_of(client)
    with pytest.raises(Exception) as raised:
        take(ingest)
    assert not isinstance(raised.value, SignatureError)
    client.fail = ConnectionError("redis gone")
    client.rpush(keys.results(RUN), sealed(1))  # wakes the thread's BLMOVE, which fails
    with pytest.raises(ConnectionError, match="redis gone"):
        take(ingest)


# ---- results signing ------------------------------------------------------------------------------


def test_open_result_takes_only_a_result_signed_for_its_run_with_the_secret():
    payload = codec.pack({"kind": "rollout", "iteration": 0, "index": 0})
    signed = signing.seal_result(RUN, payload, SECRET)
    assert signed != payload and signing.open_result(RUN, signed, SECRET) == payload
    tampered = signed[:-1] + bytes([signed[-1] ^ 1])
    forged = {
        "bad signature": [
            tampered,  # a byte of the payload changed
            signing.seal_result("other", payload, SECRET),  # moved from another run
            signing.seal_result(RUN, payload, b"another secret"),
            signed[: len(b"RLFS1")] + b"0" * 64 + payload,  # a made-up HMAC
        ],
        "not signed": [payload],
    }
    for why, items in forged.items():
        for item in items:
            with pytest.raises(SignatureError, match=why):
                signing.open_result(RUN, item, SECRET)
    # Without a secret nothing is checked: a signed result's payload comes out, an unsigned one as it is.
    assert signing.seal_result(RUN, payload, None) == payload
    assert signing.open_result(RUN, signed, None) == payload == signing.open_result(RUN, payload, None)


# ---- the signed version field -----------------------------------------------------------------------


def test_a_signed_blob_relabelled_as_another_version_is_refused_by_the_store():
    """A genuine signed v1, its metadata saying v2 and stored as v2: only the signature over the version
    field refuses it (the store's own check compares the claimed version with the key, which agree)."""
    import torch

    from rlfarm.farm.store import PolicyCorrupt, PolicyStore

    store = PolicyStore(None, RUN, secret=SECRET)
    state = {"w": torch.ones(2, 3)}
    blob = codec.encode_policy(state, {"version": "1", "algo": "ppo", "run": RUN}, SECRET)
    assert store.check(1, blob)[1]["version"] == "1"
    meta = codec.policy_metadata(blob)
    relabelled = codec.encode_policy(state, {**meta, "version": "2"})  # the genuine hmac kept
    with pytest.raises(PolicyCorrupt, match="version 2 is corrupt: policy blob has a bad signature"):
        store.check(2, relabelled)
    assert PolicyStore(None, RUN, secret=None).check(2, relabelled)[1]["version"] == "2"  # unsigned farm


# ---- SIGTERM once ---------------------------------------------------------------------------------


def test_a_second_sigterm_inside_celerys_handler_does_not_run_it_again():
    """rlfarm.worker.hooks._term_once: Celery's SIGTERM handler, interrupted by another SIGTERM, is not
    entered again (a worker was found deadlocked in four nested runs of it, waiting for its own lock)."""
    from rlfarm.worker import hooks

    calls = []

    def celery_handler(signum, frame):
        calls.append(signum)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGTERM)  # arrives, and is handled, inside this handler

    previous = signal.signal(signal.SIGTERM, celery_handler)
    try:
        hooks._term_once()
        hooks._term_once()  # installed once, not wrapped twice
        once = signal.getsignal(signal.SIGTERM)
        assert once is not celery_handler and getattr(once, "rlfarm_once", False)
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert calls == [signal.SIGTERM]


# ---- the lag bound's "auto" size --------------------------------------------------------------------


@pytest.mark.parametrize(
    "tasks, versions, bound",
    [(1, 1.0, 2), (3, 1.0, 6), (2, 0.25, 1), (3, 0.5, 3), (2, 0.3, 2), (1, 0.1, 1), (1, 0.0, 1)],
)
def test_the_auto_lag_bound_is_two_results_in_flight_worth_of_versions_at_least_one(tasks, versions, bound):
    from rlfarm.trainer.asynchronous import auto_policy_lag

    assert auto_policy_lag(tasks, versions) == bound


# ---- the signed messages, byte for byte -------------------------------------------------------------
GOLDEN = b"golden"


def _documented(tag: bytes, obj) -> str:
    """The HMAC of `tag + canonical(obj)` as rlfarm.core.signing's docstring spells canonical out."""
    return hmac.new(GOLDEN, tag + json.dumps(obj, sort_keys=True, separators=(",", ":")).encode(), "sha256").hexdigest()


def test_each_signature_covers_the_documented_bytes():
    """Signer and checker share each message function, so a changed tag, key or encoding passed every
    other test; workers and trainers of two releases would refuse each other's data. Non-ASCII values
    hold the encoding (canonical is ASCII-only)."""
    spec = {"run": "ré", "seed": 1, "version": 0}
    assert signing.sign_spec(spec, GOLDEN)["sig"] == _documented(b"rlfarm-spec\0", spec)
    meta = json.loads(signing.seal_run_meta("ré", {"env": "café"}, GOLDEN))
    assert meta["hmac"] == _documented(b"rlfarm-run-meta\0", {"run": "ré", "meta": json.dumps({"env": "café"})})
    policy = {"run": "ré", "version": "3", "sha256": "ab", "algo": "ppo", "env": "é", "policy": "{}", "created": "1"}
    signed = {k: v for k, v in policy.items() if k != "created"}
    assert signing.policy_hmac(policy, GOLDEN) == _documented(b"rlfarm-policy\0", signed)
    holder = {"host": "h", "pid": 1}
    assert signing.sign_claim("ré", holder, GOLDEN)["hmac"] == _documented(
        b"rlfarm-claim\0", {"run": "ré", "holder": holder}
    )
    params = {"lr": 0.1, "note": "é"}
    assert signing.trial_signature("sé", 2, params, GOLDEN) == _documented(
        b"rlfarm-sweep-trial\0", {"study": "sé", "number": 2, "params": params}
    )
    mac = hmac.new(GOLDEN, b"rlfarm-result\0r\xc3\xa9\0payload", "sha256").hexdigest()
    assert signing.seal_result("ré", b"payload", GOLDEN) == b"RLFS1" + mac.encode() + b"payload"


def test_a_signature_that_is_not_ascii_is_refused_as_a_bad_signature():
    """A forged signature of any characters is a SignatureError, never a UnicodeEncodeError that the
    callers (which catch SignatureError) would let end the run."""
    message = b"rlfarm-spec\0{}"
    good = signing.sign(message, GOLDEN)
    for forged in ["é" * 64, good[:-1] + "é", "\udcff"]:
        with pytest.raises(SignatureError, match="bad signature"):
            signing.verify(message, forged, GOLDEN, "task spec")
    signing.verify(message, good, GOLDEN, "task spec")


# ---- config bounds ---------------------------------------------------------------------------------


def test_a_network_of_exactly_max_layers_is_accepted():
    """The layer bound's edge: 65 layers are refused (tests/test_bounds.py), 64 are not (`>=` passed)."""
    from rlfarm import config as C
    from rlfarm.config import bounds as B

    layers = "[" + ", ".join(["8"] * B.MAX_LAYERS) + "]"
    assert len(C.build("cartpole-ppo", [f"policy.hidden_sizes={layers}"]).policy.hidden_sizes) == B.MAX_LAYERS


def test_a_result_whose_signature_bytes_are_not_ascii_is_refused_as_forged():
    """Non-ASCII bytes where a result's HMAC belongs are a SignatureError (the result is dropped and
    counted), never a UnicodeDecodeError, which the ingest raises in the main thread (the run ends)."""
    payload = codec.pack({"kind": "rollout", "iteration": 0, "index": 0})
    with pytest.raises(SignatureError, match="bad signature"):
        signing.open_result(RUN, b"RLFS1" + b"\xff" * 64 + payload, SECRET)

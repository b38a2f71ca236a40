"""Guards held at their edges by unit tests, found by mutation testing (docs/reliability.md, "Mutation
testing"; scripts/mutation.sh). Each test here failed with the mutant or guard removal it names applied.

- results signing (rlfarm.core.signing.open_result) as a function (tests/test_ingest.py refuses a
  forged result in the ingest thread that calls it, against a real redis-server);
- the signed version field of a policy blob: a genuine blob relabelled as another version is refused
  by the store's check, not only by the codec;
- a second SIGTERM inside Celery's handler does not run it again (rlfarm.worker.hooks._term_once);
- the lag bound's "auto" size (rlfarm.trainer.asynchronous.auto_policy_lag).
"""

from __future__ import annotations

import hmac
import json
import signal

import numpy as np
import pytest

from rlfarm.core import codec, signing
from rlfarm.core.protocol import Result
from rlfarm.errors import SignatureError

SECRET = b"guards-test-secret-0123456789abcdef"
RUN = "guarded"


def sealed(iteration: int, run: str = RUN, secret: bytes | None = SECRET) -> bytes:
    """A rollout result as a worker pushes it (signed with `secret`; None: unsigned)."""
    result = Result("rollout", iteration, 0, version=0, worker="w@test", rollout={"obs": np.zeros(3, np.float32)})
    return signing.seal_result(run, codec.pack(result.to_message()), secret)


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

    from rlfarm.errors import PolicyCorrupt
    from rlfarm.farm.policies.store import PolicyStore

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
    from rlfarm.trainer.policy_lag import auto_policy_lag

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
    from rlfarm.sections import bounds as B

    layers = "[" + ", ".join(["8"] * B.MAX_LAYERS) + "]"
    assert len(C.build("cartpole-ppo", [f"policy.hidden_sizes={layers}"]).policy.hidden_sizes) == B.MAX_LAYERS


def test_a_result_whose_signature_bytes_are_not_ascii_is_refused_as_forged():
    """Non-ASCII bytes where a result's HMAC belongs are a SignatureError (the result is dropped and
    counted), never a UnicodeDecodeError, which the ingest raises in the main thread (the run ends)."""
    payload = codec.pack({"kind": "rollout", "iteration": 0, "index": 0})
    with pytest.raises(SignatureError, match="bad signature"):
        signing.open_result(RUN, b"RLFS1" + b"\xff" * 64 + payload, SECRET)

"""Optional HMAC-SHA256 signing of what workers and `rlfarm eval` read from Redis or from files.

The secret is shared by every process of a farm through the environment variable RLFARM_SECRET
(never in code or on a command line; `openssl rand -hex 32` makes a good one). Unset or empty:
nothing is signed and nothing is checked, which is how rlfarm behaved before. Set: writers sign,
and readers refuse what is unsigned or does not verify. A process that can write to Redis but does
not hold the secret can then no longer forge a run's metadata, a task spec or a policy.

What is signed, and how (hex HMAC-SHA256; every message starts with a domain tag, so a signature
made for one kind of object never verifies as another):

- Run metadata (`rlfarm:<run>:meta`): with a secret, the key holds a JSON wrapper
  `{"signed": "<the metadata as JSON text>", "hmac": "<hex>"}` over
  `b"rlfarm-run-meta\\0" + canonical({"run": run_id, "meta": <that text>})`, so metadata cannot be
  replayed under another run id. A reader with a secret refuses plain (unsigned) metadata and a
  wrapper that does not verify; a reader without one reads both forms (`open_run_meta`).
- Policy blobs (safetensors): the metadata field `hmac` signs `b"rlfarm-policy\\0" +
  canonical({...})` of the fields in POLICY_SIGNED_FIELDS that the blob carries (run, version,
  sha256 of the tensors, algo, for exported files env and policy config, and in a run of several
  policies the line a blob is of, the line versions a run version is made of and the run version a
  line version was published with: rlfarm.farm.policies.lines). The sha256 is the
  digest codec computes anyway, so signing costs one HMAC over a few hundred bytes, not a second
  pass over the weights. A blob cannot be replayed under another version or run, and weights with a
  recomputed sha256 no longer pass.
- Task specs: `sign_spec` adds "sig" over `b"rlfarm-spec\\0" + canonical(all other fields)`;
  `verify_spec` checks and strips it.
- Sweep trials: the user attr "signature" of an Optuna trial a sweep sampled, over
  `b"rlfarm-sweep-trial\\0" + canonical({"study": name, "number": n, "params": {...}})`, so a trial
  someone else appended to the study, or params added to one of ours, do not verify.

`canonical` is `json.dumps(obj, sort_keys=True, separators=(",", ":"))`, ASCII-only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from typing import Any

from rlfarm.errors import SignatureError

SECRET_ENV = "RLFARM_SECRET"
# A field a blob carries is signed with it; one it lacks is left out of the message, so a field
# stripped from a signed blob, or added to it, no longer verifies.
POLICY_SIGNED_FIELDS = ("run", "version", "sha256", "algo", "env", "policy", "line", "lines", "run_version")

_META_TAG = b"rlfarm-run-meta\0"
_POLICY_TAG = b"rlfarm-policy\0"
_SPEC_TAG = b"rlfarm-spec\0"


def secret_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The shared secret from RLFARM_SECRET as bytes; None when unset or empty (signing off)."""
    value = (os.environ if environ is None else environ).get(SECRET_ENV, "")
    return value.encode() if value else None


def _key(secret: bytes | str) -> bytes:
    return secret.encode() if isinstance(secret, str) else bytes(secret)


def canonical(obj: Any) -> bytes:
    """Deterministic bytes of a JSON-able value: sorted keys, no whitespace, ASCII."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def sign(data: bytes, secret: bytes | str) -> str:
    """Hex HMAC-SHA256 of `data`."""
    return hmac.new(_key(secret), data, hashlib.sha256).hexdigest()


def verify(data: bytes, signature: str | None, secret: bytes | str, what: str = "data") -> None:
    """Raise SignatureError unless `signature` is the HMAC of `data` (constant-time comparison)."""
    if not signature:
        raise SignatureError(
            f"{what} is not signed, but this farm signs its data ({SECRET_ENV}, or the "
            f"secret the embedded farm made): refusing it"
        )
    if not isinstance(signature, str) or not hmac.compare_digest(
        sign(data, secret).encode(), signature.encode("ascii", "replace")
    ):
        raise SignatureError(f"{what} has a bad signature (forged, or signed with another {SECRET_ENV}): refusing it")


# ---- a run's claim (rlfarm.farm.claim) -------------------------------------------------------------
_CLAIM_TAG = b"rlfarm-claim\0"


def sign_claim(run_id: str, holder: Mapping[str, Any], secret: bytes | str | None) -> dict[str, Any]:
    """The claim's JSON fields with "hmac" over (run, fields) added; unchanged without a secret."""
    fields = {k: v for k, v in holder.items() if k != "hmac"}
    if not secret:
        return fields
    return {**fields, "hmac": sign(_CLAIM_TAG + canonical({"run": run_id, "holder": fields}), secret)}


def claim_signed(run_id: str, holder: Mapping[str, Any], secret: bytes | str | None) -> bool:
    """Whether a claim read from Redis was written by a trainer holding the secret (always, without one)."""
    if not secret:
        return True
    fields = {k: v for k, v in holder.items() if k != "hmac"}
    try:
        verify(_CLAIM_TAG + canonical({"run": run_id, "holder": fields}), holder.get("hmac"), secret, "claim")
    except (SignatureError, TypeError, ValueError):
        return False
    return True


# ---- run metadata --------------------------------------------------------------------------------


def _meta_message(run_id: str, text: str) -> bytes:
    return _META_TAG + canonical({"run": run_id, "meta": text})


def seal_run_meta(run_id: str, meta: Mapping[str, Any], secret: bytes | str | None) -> str:
    """The text to store as a run's metadata: plain JSON without a secret, the signed wrapper with one."""
    text = json.dumps(meta)
    if secret is None:
        return text
    return json.dumps({"signed": text, "hmac": sign(_meta_message(run_id, text), secret)})


def _is_wrapper(obj: Any) -> bool:
    return isinstance(obj, dict) and set(obj) == {"signed", "hmac"} and isinstance(obj["signed"], str)


def open_run_meta(run_id: str, raw: bytes | str, secret: bytes | str | None) -> dict[str, Any]:
    """The metadata stored by `seal_run_meta`; with a secret, only if it is signed and verifies."""
    obj = json.loads(raw)
    what = f"run {run_id!r}: metadata in Redis"
    if not _is_wrapper(obj):
        if secret is not None:
            raise SignatureError(
                f"{what} is not signed, but this farm signs its data ({SECRET_ENV}, or the "
                f"secret the embedded farm made): refusing it"
            )
        return obj
    if secret is not None:
        verify(_meta_message(run_id, obj["signed"]), obj["hmac"], secret, what)
    return json.loads(obj["signed"])


# ---- policies ------------------------------------------------------------------------------------


def _policy_message(meta: Mapping[str, str]) -> bytes:
    return _POLICY_TAG + canonical({k: str(meta[k]) for k in POLICY_SIGNED_FIELDS if k in meta})


def policy_hmac(meta: Mapping[str, str], secret: bytes | str) -> str:
    """The `hmac` metadata field of a policy blob whose metadata (sha256 included) is `meta`."""
    return sign(_policy_message(meta), secret)


def verify_policy(meta: Mapping[str, str], secret: bytes | str, what: str = "policy") -> None:
    """Raise SignatureError unless the blob metadata's `hmac` matches its signed fields."""
    verify(_policy_message(meta), meta.get("hmac"), secret, what)


# ---- task specs ----------------------------------------------------------------------------------


def _spec_message(spec: Mapping[str, Any]) -> bytes:
    return _SPEC_TAG + canonical({k: v for k, v in spec.items() if k != "sig"})


def sign_spec(spec: Mapping[str, Any], secret: bytes | str | None) -> dict[str, Any]:
    """A copy of `spec` with "sig" over all its other fields; unchanged (no "sig") without a secret."""
    out = {k: v for k, v in spec.items() if k != "sig"}
    if secret is not None:
        out["sig"] = sign(_spec_message(out), secret)
    return out


def verify_spec(spec: Mapping[str, Any], secret: bytes | str | None) -> dict[str, Any]:
    """`spec` without its "sig"; with a secret, raises SignatureError if "sig" is missing or wrong."""
    if secret is not None:
        verify(_spec_message(spec), spec.get("sig"), secret, "task spec")
    return {k: v for k, v in spec.items() if k != "sig"}


# ---- sweep trials -------------------------------------------------------------------------------
_TRIAL_TAG = b"rlfarm-sweep-trial\0"


def _trial_message(study: str, number: int, params: Mapping[str, Any]) -> bytes:
    return _TRIAL_TAG + canonical({"study": study, "number": number, "params": dict(params)})


def trial_signature(study: str, number: int, params: Mapping[str, Any], secret: bytes | str) -> str:
    """The "signature" user attr of trial `number` of sweep `study`, sampled with these params."""
    return sign(_trial_message(study, number, params), secret)


def verify_trial(study: str, number: int, params: Mapping[str, Any], signature: Any, secret: bytes | str) -> None:
    """Raise SignatureError unless `signature` is this trial's (its params as read back)."""
    try:
        message = _trial_message(study, number, params)
    except (TypeError, ValueError):  # params no JSON can carry (NaN, ...): nothing of ours
        raise SignatureError(f"trial {number} of sweep {study!r} has params no sweep signs: refusing it") from None
    verify(message, signature, secret, f"trial {number} of sweep {study!r}")


# ---- results -------------------------------------------------------------------------------------
# A result pushed by a worker: with a secret, `_RESULT_MAGIC + hex HMAC + msgpack payload`, the HMAC
# over `_RESULT_TAG + run id + payload`, so a process without the secret cannot slip a forged
# rollout (poisoned training data) into a run's results list, nor move one from another run.
_RESULT_TAG = b"rlfarm-result\0"
_RESULT_MAGIC = b"RLFS1"


def seal_result(run_id: str, payload: bytes, secret: bytes | str | None) -> bytes:
    """What a worker pushes: the payload as it is without a secret, signed with one."""
    if secret is None:
        return payload
    mac = sign(_RESULT_TAG + run_id.encode() + b"\0" + payload, secret).encode()
    return _RESULT_MAGIC + mac + payload


def open_result(run_id: str, data: bytes, secret: bytes | str | None) -> bytes:
    """The payload of a pushed result; with a secret, only if it is signed for this run and verifies."""
    signed = data.startswith(_RESULT_MAGIC)
    n = len(_RESULT_MAGIC)
    payload = data[n + 64 :] if signed else data
    if secret is not None:
        mac = data[n : n + 64].decode("ascii", "replace") if signed else None
        verify(_RESULT_TAG + run_id.encode() + b"\0" + payload, mac, secret, f"a result of run {run_id!r}")
    return payload

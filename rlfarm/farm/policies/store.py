"""PolicyStore: a run's versioned policies and its metadata in Redis (keys: rlfarm.farm.keys).

The trainer publishes a version (blob, version set and `latest` pointer in one transaction), pins the
ones retention must not trim (the best, those being evaluated) and keeps its own copies of what it
wrote, to put back what someone else replaced; workers read the metadata and the versions they act
with. With RLFARM_SECRET set (rlfarm.core.signing), `meta` holds {"signed": <that JSON>, "hmac": ...}
and each policy blob's metadata an `hmac`; a store with a secret refuses unsigned or forged ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import redis

from rlfarm.core import codec, signing
from rlfarm.errors import PolicyCorrupt, PolicyError, PolicyNotFound, PolicyTrimmed, RunNotFound
from rlfarm.farm import keys

if TYPE_CHECKING:  # torch is imported where tensors are made (codec): `rlfarm status` needs none
    import torch


FROM_ENV: Any = object()  # PolicyStore's default secret: RLFARM_SECRET, read when the store is made


def _as_int(raw: Any) -> int | None:
    """A version number read from Redis; None for anything else (written by someone else)."""
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _show(raw: Any) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return repr(text[:40])


class PolicyStore:
    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        keep: int = 5,
        secret: bytes | str | None = FROM_ENV,
        line: str | None = None,
        on_forged: Callable[[str], None] | None = None,
    ):
        """`on_forged(text)`: told of a pointer or listing of the run found as this store did not write
        it (refused, and overwritten by the next write); the trainer counts and says it."""
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.client = client
        self.run_id = run_id
        # None: the run's version line; a policy's name: that policy's own line (rlfarm.farm.policies.lines),
        # with keys of its own, and blobs that say whose line they are in their signed metadata.
        self.line = line
        self.keep = keep
        # Signs what it writes and verifies what it reads (run meta, policies); None: neither.
        self.secret = signing.secret_from_env() if secret is FROM_ENV else secret
        # Versions retention never trims (the best one, those being evaluated), with their blobs, so a
        # trainer can write them back after Redis lost its data. Only the run's trainer pins.
        self.pinned: dict[int, bytes] = {}
        self.holders: dict[int, set[str]] = {}  # who keeps each pinned version (pin, unpin)
        # The newest version this store published, as it wrote it: what it pins or writes back is its
        # own copy, never bytes read back from Redis, which anyone who can write to Redis can replace.
        self.own: tuple[int, bytes] | None = None
        self.own_meta: bytes | None = None
        # The versions this store lists (`versions`), as it wrote them: the listing in Redis is written
        # from this, never read back into it (None until the first publish reads what a resumed run has).
        self.listed: set[int] | None = None
        self.on_forged: Callable[[str], None] = on_forged or (lambda text: None)

    def _key(self, version: int) -> str:
        return keys.policy(self.run_id, version, self.line)

    @property
    def _latest_key(self) -> str:
        return keys.latest(self.run_id, self.line)

    @property
    def _versions_key(self) -> str:
        return keys.versions(self.run_id, self.line)

    @property
    def _pinned_key(self) -> str:
        return keys.pinned(self.run_id, self.line)

    def _name(self, version: int | str) -> str:
        """How errors name a version: `policy version 3`, `policy 'agent' version 3` (its own line)."""
        return f"{self._what()} version {version}"

    def _what(self) -> str:
        return "policy" if self.line is None else f"policy {self.line!r}"

    # ---- run metadata --------------------------------------------------------------------------
    def set_run_meta(self, meta: Mapping[str, Any]) -> None:
        text = signing.seal_run_meta(self.run_id, meta, self.secret)
        self.client.set(keys.meta(self.run_id), text)
        self.own_meta = text.encode()  # as written, to put back if it is replaced (write_back)

    def run_meta(self) -> dict[str, Any]:
        raw = self.client.get(keys.meta(self.run_id))
        if raw is None:
            raise RunNotFound(f"run {self.run_id!r} has no metadata in Redis (unknown run?)")
        return signing.open_run_meta(self.run_id, raw, self.secret)  # SignatureError if forged

    # ---- versions ------------------------------------------------------------------------------
    def publish(
        self,
        version: int,
        state: Mapping[str, torch.Tensor],
        algo: str,
        extra: Mapping[str, str] | None = None,
        pipe: redis.client.Pipeline | None = None,
    ) -> bytes:
        """Store `version` and move `latest` to it in one transaction; trim beyond `keep`. `pipe`: a
        transaction of the caller's to add the writes to (it executes it), so that several lines'
        versions are published as one (rlfarm.farm.policies.lines).

        The store owns its version line: `latest` and the listing are written from what it published,
        never taken from Redis. One it did not write (`SET ...:policy:latest 9999`, a member added to
        `versions`) is refused: reported through `on_forged` and overwritten by this transaction."""
        if self.own is not None and version <= self.own[0]:
            raise ValueError(f"version {version} is not newer than the latest ({self.own[0]})")
        reads = self.client.pipeline(transaction=False)
        reads.get(self._latest_key)
        reads.zrange(self._versions_key, 0, -1)
        raw_latest, raw_listed = reads.execute()
        latest, listed = _as_int(raw_latest), {v for v in map(_as_int, raw_listed) if v is not None}
        if self.own is None:
            if latest is not None and version <= latest and self.genuine(latest):
                raise ValueError(f"version {version} is not newer than the latest ({latest})")
            self.listed = {v for v in listed if v < version}  # a resumed run's; forged newer ones left out
        else:
            if raw_latest is not None and latest != self.own[0]:  # None: flushed, not forged
                self.on_forged(
                    f"refused {self._latest_key} = {_show(raw_latest)}: this trainer "
                    f"published v{self.own[0]} last; writing v{version}"
                )
            if raw_listed and (listed != self.listed or len(raw_listed) != len(listed)):
                self.on_forged(
                    f"refused {self._versions_key}: it lists "
                    f"{sorted(_show(v) for v in raw_listed)[:8]}, this trainer "
                    f"{sorted(self.listed or ())}; writing its own"
                )
        meta = {
            "version": str(version),
            "algo": algo,
            "run": self.run_id,
            "created": f"{time.time():.6f}",
            **({"line": self.line} if self.line is not None else {}),
            **(extra or {}),
        }
        blob = codec.encode_policy(state, meta, self.secret)
        assert self.listed is not None
        self.listed.add(version)
        old = sorted(v for v in self.listed if v <= version - self.keep and v not in self.pinned)
        self.listed.difference_update(old)
        writes = self.client.pipeline(transaction=True) if pipe is None else pipe
        writes.set(self._key(version), blob)
        writes.delete(self._versions_key)
        writes.zadd(self._versions_key, {str(v): v for v in self.listed})
        writes.set(self._latest_key, version)
        if old:
            writes.delete(*[self._key(v) for v in old])
        if pipe is None:
            writes.execute()
        self.own = (version, blob)
        return blob

    # ---- a version line per policy (rlfarm.farm.policies.lines.LinedStore); one policy has none ----------------
    def lines_of(self, version: int | str) -> dict[str, int] | None:
        """The policies' line versions run version `version` is made of: None, one policy's run."""
        return None

    @property
    def heads(self) -> dict[str, int]:
        """Each policy's newest line version: none for one policy's run."""
        return {}

    def restore_heads(self, heads: Mapping[str, int] | None) -> None:
        """A resumed trainer's lines go on numbering from the checkpoint's `heads`: nothing to do here."""

    def genuine(self, version: int) -> bool:
        """Whether Redis holds a policy `version` that passes `check` (a pointer to nothing, or to a
        forged blob, is not a newer version)."""
        try:
            self.get(version)
        except PolicyError:
            return False
        return True

    def pin(self, version: int, holder: str = "") -> bytes:
        """Keep `version` whatever `keep` says (listed in `rlfarm:<run>:pinned`); returns its blob: the
        store's own copy when it published it, else the one in Redis once it passes `get`'s checks
        (PolicyCorrupt if not): a blob forged in Redis is never pinned, nor re-signed from there.
        `holder`: who keeps it ("" the evaluations, "league" self-play's league): it stays pinned
        until every holder has unpinned it."""
        self.holders.setdefault(version, set()).add(holder)
        if version not in self.pinned:
            if self.own is not None and self.own[0] == version:
                self.pinned[version] = self.own[1]
            else:
                blob = self.get_blob(version)
                self.check(version, blob)
                self.pinned[version] = blob
            self.client.sadd(self._pinned_key, version)
        return self.pinned[version]

    def unpin(self, version: int, holder: str = "") -> None:
        """`holder` lets go of `version`; once none holds it, back to normal retention: trimmed now if
        it is older than the `keep` newest."""
        held = self.holders.get(version, set())
        held.discard(holder)
        if held:
            return
        self.holders.pop(version, None)
        if self.pinned.pop(version, None) is None:
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.srem(self._pinned_key, version)
        latest = self.latest()
        if latest is not None and version <= latest - self.keep:
            pipe.delete(self._key(version))
            pipe.zrem(self._versions_key, str(version))
            if self.listed is not None:
                self.listed.discard(version)
        pipe.execute()

    def restore_newest(self) -> int | None:
        """Put back the newest version this store published, with its listing and `latest`, if Redis
        no longer has it: a replica promoted by a failover lacks the writes it had not yet copied
        (replication is asynchronous). Returns the version written back, or None."""
        if self.own is None:
            return None
        version, blob = self.own
        pipe = self.client.pipeline(transaction=False)
        pipe.exists(self._key(version))
        pipe.get(self._latest_key)
        present, latest = pipe.execute()
        if present and latest is not None and int(latest) >= version:
            return None
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self._key(version), blob)
        pipe.zadd(self._versions_key, {str(version): version})
        pipe.set(self._latest_key, version)
        pipe.execute()
        return version

    def restore_pinned(self) -> None:
        """Write pinned versions back (after Redis lost its data)."""
        if not self.pinned:
            return
        pipe = self.client.pipeline(transaction=True)
        for version, blob in self.pinned.items():
            pipe.set(self._key(version), blob)
            pipe.zadd(self._versions_key, {str(version): version})
            pipe.sadd(self._pinned_key, version)
        pipe.execute()

    def export(self, version: int | str) -> tuple[bytes, str]:
        """Version `version` (or "latest") as a policy file (`rlfarm checkpoints export`): its blob, checked,
        with the run's env and [policy] section added so `rlfarm eval` can play it; returns (bytes, version).
        The hmac covers env and policy too: re-signed with this store's secret (verified on the way
        in), else dropped."""
        import json

        state, meta = self.get(version)
        run_cfg = self.run_meta()["config"]
        meta = {**meta, "env": run_cfg["env"]["id"], "policy": json.dumps(run_cfg["policy"])}
        meta.pop("sha256", None)
        meta.pop("hmac", None)
        return codec.encode_policy(state, meta, self.secret), meta["version"]

    def forget_pins(self) -> None:
        """Drop the pins a dead trainer of this run left (a resumed trainer: its evaluations are gone)."""
        self.pinned.clear()
        self.holders.clear()
        self.client.delete(self._pinned_key)

    def write_back(self) -> list[str]:
        """Put back what this store wrote that Redis no longer holds as written (the run metadata, the
        newest version, pinned versions), e.g. replaced by someone without the secret, whose copy the
        workers refused. Returns what was put back ("the run metadata", "policy v3")."""
        own: dict[str, tuple[str, bytes]] = {}
        if self.own_meta is not None:
            own[keys.meta(self.run_id)] = ("the run metadata", self.own_meta)
        for version, blob in ([self.own] if self.own else []) + list(self.pinned.items()):
            own[self._key(version)] = (f"{self._what()} v{version}", blob)
        if not own:
            return []
        names = list(own)
        pipe = self.client.pipeline(transaction=True)
        written = []
        for key, current in zip(names, self.client.mget(names)):
            what, blob = own[key]
            if current != blob:
                pipe.set(key, blob)
                written.append(what)
        pipe.execute()
        return written

    def latest(self) -> int | None:
        """Redis's pointer to the newest version (None when absent or not a version number)."""
        return _as_int(self.client.get(self._latest_key))

    def versions(self) -> list[int]:
        """The retained versions, oldest first (members that are not version numbers are skipped)."""
        found = (_as_int(v) for v in self.client.zrange(self._versions_key, 0, -1))
        return sorted(v for v in found if v is not None)

    def get_blob(self, version: int | str) -> bytes:
        """Raw safetensors bytes of a version ('latest' allowed), with a clear error when absent."""
        if version == "latest":
            latest = self.latest()
            if latest is None:
                raise PolicyNotFound(f"run {self.run_id!r} has no published policy")
            version = latest
        version = int(version)
        blob = self.client.get(self._key(version))
        if blob is None:
            latest = self.latest()
            retained = self.versions()
            if latest is not None and version < latest and (not retained or version < retained[0]):
                raise PolicyTrimmed(
                    f"run {self.run_id!r}: {self._name(version)} was trimmed; retained versions "
                    f"are {retained[0]}..{retained[-1]}"
                    if retained
                    else f"run {self.run_id!r}: {self._name(version)} was trimmed"
                )
            raise PolicyNotFound(f"run {self.run_id!r}: no {self._name(version)} (latest is {latest})")
        return blob

    def get(self, version: int | str, arrays: str = "torch") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Tensors and metadata of a version ('latest' allowed), checked: sha256, the hmac when the
        store has a secret, and that the blob is the version (and run) of the key it was read from.
        `arrays="numpy"`: numpy arrays, without torch (codec.decode_policy)."""
        if version == "latest":
            latest = self.latest()
            version = "latest" if latest is None else latest  # None: get_blob raises a clear error
        return self.check(version, self.get_blob(version), arrays)

    def check(
        self, version: int | str, blob: bytes, arrays: str = "torch"
    ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Tensors and metadata of `blob`, read as `version` of this run: PolicyCorrupt unless its
        sha256, its hmac (with a secret) and the version and run it claims hold. `arrays="numpy"`:
        numpy arrays, without torch (codec.decode_policy)."""
        try:
            state, meta = codec.decode_policy(blob, self.secret, arrays)
        except codec.CodecError as exc:
            raise PolicyCorrupt(f"run {self.run_id!r}: {self._name(version)} is corrupt: {exc}") from None
        self._check_claims(version, meta)
        return state, meta

    def signed_meta(self, version: int) -> dict[str, str]:
        """Version `version`'s metadata, read from its blob's header alone (its tensors stay in Redis)
        and checked as `check` checks a whole blob, but for the tensors' sha256: with a secret, the
        hmac over the signed fields (rlfarm.core.signing), and the version, run and line it claims.
        What a worker reads to learn which line versions a run version is made of (rlfarm.farm.policies.lines)."""
        key = self._key(int(version))
        prefix = self.client.getrange(key, 0, 4095)
        if not prefix:
            self.get_blob(version)  # absent: its clear error (trimmed, or not published)
            raise PolicyCorrupt(f"run {self.run_id!r}: {self._name(version)} is empty: refusing it")
        try:
            size = codec.policy_header_size(prefix)
            if size > len(prefix):
                prefix += self.client.getrange(key, len(prefix), size - 1)
            meta = codec.policy_metadata(prefix)
            if self.secret is not None:
                signing.verify_policy(meta, self.secret, "policy blob")
        except (codec.CodecError, signing.SignatureError) as exc:
            raise PolicyCorrupt(f"run {self.run_id!r}: {self._name(version)} is corrupt: {exc}") from None
        self._check_claims(version, meta)
        return meta

    def _check_claims(self, version: int | str, meta: Mapping[str, str]) -> None:
        """PolicyCorrupt unless the blob's metadata says it is `version` of this run and line."""
        claimed, run = meta.get("version"), meta.get("run")
        if claimed != str(int(version)):
            raise PolicyCorrupt(
                f"run {self.run_id!r}: {self._what()} stored as v{int(version)} but claims v{claimed}: refusing it"
            )
        if run is not None and run != self.run_id:
            raise PolicyCorrupt(f"run {self.run_id!r}: {self._name(version)} belongs to run {run!r}: refusing it")
        if meta.get("line") != self.line:  # one policy's weights where another's (or the run's) belong
            other = meta.get("line")
            whose = "the run's version line" if other is None else f"the own line of policy {other!r}"
            raise PolicyCorrupt(f"run {self.run_id!r}: {self._name(version)} belongs to {whose}: refusing it")

    def info(self, version: int) -> dict[str, str]:
        meta = codec.policy_metadata(self.get_blob(version))
        meta["bytes"] = str(len(self.client.get(self._key(version)) or b""))
        return meta

"""The worker's end of the policy channel: which version a task acts with, and its checked tensors.

A task names a version or "latest" (the run's pointer, read per task). A run of several policies acts
with each policy's own line version: the task's `lines`, else the ones the run version's signed
metadata names (read from its blob's header and checked as the blob is); a line's own pointer is never
read, so one held back or forged cannot mix stale weights into a fresh version. Each blob is checked
(sha256, the hmac with RLFARM_SECRET, that it is the version and run of its key) before its tensors
are used. One process of a machine fetches a version and the others read its copy
(SharedPolicies of rlfarm.farm.policies.machine, given as `shared`); a damaged copy is dropped and fetched again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlfarm.errors import PolicyCorrupt, PolicyNotFound, PolicyTrimmed
from rlfarm.farm.policies.lines import joined, lines_named
from rlfarm.farm.policies.store import PolicyStore

if TYPE_CHECKING:
    import redis


class PolicyReceiver:
    """Fetches and checks versions for one process. `shared`: the machine's copies (None: each process
    fetches its own); `incarnations`: the trainer incarnation of each run, which keys a shared copy (no
    entry: not a task's, nothing to key it by); fetches and their bytes are counted into `counts`.
    `line_states` keeps each policy's line versions while the process acts with them (any object with
    `get` and `put`, rlfarm.worker.cache.PolicyCache)."""

    def __init__(
        self,
        client: redis.Redis,
        shared: Any,
        incarnations: Mapping[str, str],
        counts: dict[str, int],
        line_states: Any,
    ):
        self.client, self.shared, self.incarnations = client, shared, incarnations
        self.counts, self.line_states = counts, line_states

    def resolve(self, run: str, version: int | str) -> int:
        """The version a task acts with: its own, or for "latest" the run's newest now."""
        if version != "latest":
            return int(version)
        latest = PolicyStore(self.client, run).latest()
        if latest is None:
            raise PolicyNotFound(f"run {run!r} has no published policy")
        return latest

    def state(
        self,
        run: str,
        version: int,
        policies: Sequence[str],
        lines: Mapping[str, int] | None,
        arrays: str,
    ) -> tuple[dict[str, Any], dict[str, int] | None, bool]:
        """Run version `version`'s checked tensors ("numpy" or "torch" `arrays`), the line versions they
        are made of (None: its whole blob), and whether this process fetched anything from Redis."""
        store = PolicyStore(self.client, run)
        if len(policies) > 1 and not lines:
            lines = lines_named(store.signed_meta(version), policies)
        if lines:
            try:
                state, fetched = self._lined(run, lines, arrays)
                return state, dict(lines), fetched
            except (PolicyNotFound, PolicyTrimmed):  # a line version retention let go: the whole blob
                pass
        state, fetched = self._checked(store, run, version, arrays)
        return state, None, fetched

    def _lined(self, run: str, lines: Mapping[str, int], arrays: str) -> tuple[dict[str, Any], bool]:
        """A run version's state made of its policies' line versions, each fetched once per process
        (or machine) and kept while the process acts with it."""
        parts, fetched = {}, False
        for name, number in sorted(lines.items()):
            key = (f"{run}@{name}", int(number))
            own = self.line_states.get(key)
            if own is None:
                own, got = self._checked(PolicyStore(self.client, run, line=name), run, int(number), arrays)
                self.line_states.put(key, own)
                fetched = fetched or got
            parts[name] = own
        return joined(parts), fetched

    def _checked(self, store: PolicyStore, run: str, version: int, arrays: str) -> tuple[dict[str, Any], bool]:
        """A version's tensors, checked, and whether this process fetched it from Redis: not when another
        process of this machine had. What a process keeps is keyed by the version fetched, never by what
        the blob says about itself."""
        incarnation = self.incarnations.get(run)
        if self.shared is None or incarnation is None or not self.shared.usable():
            return self._fetch(store, version, arrays)[0], True  # (no incarnation: not a task's; nothing to key by)
        path = self.shared.path(run, incarnation, version, store.line)
        blob = self.shared.read(path)  # whole or absent: files are written beside and renamed
        if blob is None:
            with self.shared.locked(path) as held:  # one process of the machine fetches, the others wait
                blob = self.shared.read(path) if held else None
                if blob is None:
                    state, blob = self._fetch(store, version, arrays)
                    if held:
                        self.shared.write(path, blob, version, store.line)
                    return state, True
        try:
            return store.check(version, blob, arrays)[0], False
        except PolicyCorrupt:  # a damaged copy: removed, and this process fetches for itself
            self.shared.drop(path)
            return self._fetch(store, version, arrays)[0], True

    def _fetch(self, store: PolicyStore, version: int, arrays: str) -> tuple[dict[str, Any], bytes]:
        blob = store.get_blob(version)
        self.counts["policy_fetches"] += 1
        self.counts["policy_fetch_bytes"] += len(blob)
        return store.check(version, blob, arrays)[0], blob

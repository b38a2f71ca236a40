"""The policy versions a worker process acts with: fetched from Redis, or read from the copy another
process of the machine fetched (rlfarm.worker.machine), checked, made into actors and kept
(rlfarm.worker.cache). An MLP policy's actor is built from the version's tensors read as numpy arrays
(rlfarm.algos.acting): a worker acting one never imports torch. A CNN's are loaded into the run's
torch network, built once per run (torch is imported then, in this process only)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import redis

from rlfarm.algos.acting import acts_without_torch, numpy_actor
from rlfarm.config import policy_config
from rlfarm.envs import SpaceSpec
from rlfarm.errors import PolicyCorrupt, PolicyNotFound, PolicyTrimmed
from rlfarm.farm.lines import joined, lines_named
from rlfarm.farm.store import PolicyStore
from rlfarm.worker.cache import PolicyCache
from rlfarm.worker.machine import SharedPolicies

MAX_NETWORKS = 4  # runs whose network one process keeps to load new versions into; LRU beyond


class PolicyVersions:
    """One process's versions. `run_meta(run)` is the run's metadata (cached by the caller), and
    `incarnations` the trainer incarnation of each run the caches are of (no entry: not a task's,
    nothing to key a shared copy by). Fetches and their bytes are counted into `counts`."""

    def __init__(
        self,
        client: redis.Redis,
        shared: SharedPolicies | None,
        run_meta: Callable[[str], dict[str, Any]],
        incarnations: Mapping[str, str],
        counts: dict[str, int],
    ):
        self.client = client
        self.shared = shared
        self.run_meta = run_meta
        self.incarnations = incarnations
        self.counts = counts
        self.cache = PolicyCache(size=4)
        # Each policy's own versions (rlfarm.farm.lines), keyed (run@policy, n): a policy that did not
        # change is not fetched again, a frozen one once.
        self.line_states = PolicyCache(size=16)
        self.made_of = PolicyCache(size=64)  # (run, version) -> the line versions its actor acts with
        # One network per run, built once and loaded with each new version's weights: building it
        # (torch's weight initialisation) was most of fetching a version, paid by every process for
        # every version (benchmarks/task_cost.py).
        # Actors are snapshots (numpy copies, or a deep copy for torch), so older cached versions
        # keep their own weights.
        self.networks: OrderedDict[str, Any] = OrderedDict()

    def drop_run(self, run: str) -> None:
        """Forget the run's network and versions (another incarnation of it: rlfarm.farm.claim)."""
        self.networks.pop(run, None)
        self.cache.drop_run(run)
        self.made_of.drop_run(run)
        self.line_states.drop_run(run, lines=True)

    def actor(self, run: str, version: int | str, lines: Mapping[str, int] | None = None) -> tuple[Any, int, bool]:
        """The acting snapshot of a version ("latest": the newest), its number, and whether it had to
        be fetched. A run of several policies acts with each policy's own version, fetched per policy
        (rlfarm.farm.lines): the task's `lines`, else the ones the run version's metadata names, read
        from its blob's header and checked as the blob is (signed with a secret): a line's own
        pointer is never read, so one held back or forged cannot mix stale weights into a fresh
        version. Which line versions acted: `acted_lines`."""
        store = PolicyStore(self.client, run)
        meta = self.run_meta(run)
        policies = meta["space"].get("policies", ())  # the spec is built only on a cache miss, below
        if version == "latest":
            latest = store.latest()
            if latest is None:
                raise PolicyNotFound(f"run {run!r} has no published policy")
            version = latest
        version = int(version)
        cached = self.cache.get((run, version))
        if cached is not None:
            return cached, version, False
        if len(policies) > 1 and not lines:
            lines = lines_named(store.signed_meta(version), policies)
        algo, spec = meta["config"]["algo"], SpaceSpec.from_dict(meta["space"])
        arrays = "numpy" if acts_without_torch(spec) else "torch"
        state = None
        if lines:
            try:
                state, fetched = self._lined_version(run, version, lines, arrays)
            except (PolicyNotFound, PolicyTrimmed):  # a line version retention let go: the whole blob
                lines = None
        if state is None:
            state, fetched = self._checked_version(store, run, version, arrays)
        if arrays == "numpy":
            actor = numpy_actor(algo, spec, policy_config(meta["config"]["policy"]), state)
        else:
            from rlfarm.algos import learner

            network = self.network(run)
            network.load_state_dict(state)
            actor = learner(algo).actor_snapshot(network)
        self.cache.put((run, version), actor)
        self.made_of.put((run, version), dict(lines) if lines else None)
        return actor, version, fetched

    def acted_lines(self, run: str, version: int) -> dict[str, int] | None:
        """The line versions run version `version`'s actor was made of (None: one policy, or its
        whole blob), for the result to say what acted."""
        return self.made_of.get((run, version))

    def _lined_version(
        self, run: str, version: int, lines: Mapping[str, int], arrays: str
    ) -> tuple[dict[str, Any], bool]:
        """Run version `version`'s state made of its policies' line versions, each fetched once per
        process (or machine) and kept while the process acts with it."""
        parts, fetched = {}, False
        for name, number in sorted(lines.items()):
            key = (f"{run}@{name}", int(number))
            own = self.line_states.get(key)
            if own is None:
                own, got = self._checked_version(PolicyStore(self.client, run, line=name), run, int(number), arrays)
                self.line_states.put(key, own)
                fetched = fetched or got
            parts[name] = own
        return joined(parts), fetched

    def _checked_version(self, store: PolicyStore, run: str, version: int, arrays: str) -> tuple[dict[str, Any], bool]:
        """A version's tensors, checked (sha256, the hmac with RLFARM_SECRET, that the blob is the
        version and run of its key), and whether this process fetched it from Redis: not when another
        process of this machine had (rlfarm.worker.machine). The process's cache is keyed by the version
        fetched, never by what the blob says about itself."""
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

    def network(self, run: str) -> Any:
        """The run's network, to load a version's weights into (built on first use; LRU of runs)."""
        if run in self.networks:
            self.networks.move_to_end(run)
            return self.networks[run]
        from rlfarm.algos import network_for

        _torch_one_thread()
        run_meta = self.run_meta(run)
        network = network_for(
            run_meta["config"]["algo"],
            SpaceSpec.from_dict(run_meta["space"]),
            policy_config(run_meta["config"]["policy"]),
        )
        self.networks[run] = network
        while len(self.networks) > MAX_NETWORKS:
            self.networks.popitem(last=False)
        return network


def _torch_one_thread() -> None:
    """torch, imported by this process at its first CNN run, on one thread: W pool processes on W
    cores, no oversubscription (the pool's initialiser sets it where torch came in with the fork)."""
    import torch

    torch.set_num_threads(1)

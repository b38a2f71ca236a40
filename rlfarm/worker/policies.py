"""The actors a worker process acts with, made from the versions the policy channel hands it
(rlfarm.farm.policies.receiver: fetched from Redis, or read from the copy another process of the
machine fetched, rlfarm.farm.policies.machine; checked) and kept (rlfarm.worker.cache). An MLP policy's actor
is built from the version's tensors read as numpy arrays (rlfarm.algos.acting): a worker acting one
never imports torch. A CNN's are loaded into the run's torch network, built once per run (torch is
imported then, in this process only)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import redis

from rlfarm.algos.acting import acts_without_torch, numpy_actor
from rlfarm.config import policy_config
from rlfarm.envs import SpaceSpec
from rlfarm.errors import PolicyTrimmed
from rlfarm.farm.policies.machine import SharedPolicies
from rlfarm.farm.policies.receiver import PolicyReceiver
from rlfarm.worker.cache import PolicyCache

MAX_NETWORKS = 4  # runs whose network one process keeps to load new versions into; LRU beyond
LATEST_ATTEMPTS = 5  # reads of "latest" when the version read was trimmed before its blob was fetched


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
        # Each policy's own versions (rlfarm.farm.policies.lines), keyed (run@policy, n): a policy that did not
        # change is not fetched again, a frozen one once.
        self.line_states = PolicyCache(size=16)
        self.made_of = PolicyCache(size=64)  # (run, version) -> the line versions its actor acts with
        self.receiver = PolicyReceiver(client, shared, incarnations, counts, self.line_states)
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
        be fetched. Which version, and its checked tensors, are the policy channel's
        (rlfarm.farm.policies.receiver); which line versions acted: `acted_lines`."""
        if version != "latest":
            return self._actor(run, int(version), lines)
        for attempt in range(LATEST_ATTEMPTS):
            number = self.receiver.resolve(run, "latest")
            try:
                return self._actor(run, number, lines)
            except PolicyTrimmed:
                # The trainer published past retention between the pointer's read and the blob's (a
                # fast publisher, a small farm.keep_versions): a newer version is there; act with it.
                if attempt == LATEST_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _actor(self, run: str, version: int, lines: Mapping[str, int] | None) -> tuple[Any, int, bool]:
        meta = self.run_meta(run)
        policies = meta["space"].get("policies", ())  # the spec is built only on a cache miss, below
        cached = self.cache.get((run, version))
        if cached is not None:
            return cached, version, False
        algo, spec = meta["config"]["algo"], SpaceSpec.from_dict(meta["space"])
        arrays = "numpy" if acts_without_torch(spec) else "torch"
        state, lines, fetched = self.receiver.state(run, version, policies, lines, arrays)
        if arrays == "numpy":
            actor = numpy_actor(algo, spec, policy_config(meta["config"]["policy"]), state)
        else:
            from rlfarm.algos import learner

            network = self.network(run)
            network.load_state_dict(state)
            actor = learner(algo).actor_snapshot(network)
        self.cache.put((run, version), actor)
        self.made_of.put((run, version), lines)
        return actor, version, fetched

    def acted_lines(self, run: str, version: int) -> dict[str, int] | None:
        """The line versions run version `version`'s actor was made of (None: one policy, or its
        whole blob), for the result to say what acted."""
        return self.made_of.get((run, version))

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

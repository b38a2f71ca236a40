"""A version line per policy, for a run of several policies (`env.policy_map`; docs/architecture.md,
decision 27).

The run's version line stays what it is for one policy: version v is every policy's weights
(`nets.<policy>.…`), what the trainer pins, evaluates, exports and resumes. Beside it each policy has
a line of its own (`PolicyStore(..., line=p)`: keys `policy@<p>:<n>`, `versions@<p>`, ...), which gets
a new version only when that policy's weights changed: a frozen policy's line holds one version for
the whole run, a policy whose learner was not ready keeps its last. Workers act with the policies'
own versions (`TaskSpec.lines`, or for an ASYNC task the ones the newest run version's signed
metadata names, never a line's own `latest` pointer), fetched and cached per policy, so an unchanged
policy is never fetched again; results say which line versions acted, and the trainer measures and
bounds each policy's lag on its own line from them.

`LinedStore` is the run's store with its lines: one transaction publishes run version v and the
line versions it is made of (a worker that reads the run's pointer finds the line versions published
with it), and pinning, retention, write-back and restore go to the lines with the run version.
Everything each line holds is signed and checked as a run version is, and a blob is refused under
another line's key (its metadata names its line).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis

from rlfarm.core import codec
from rlfarm.farm.policies.store import FROM_ENV, PolicyStore

if TYPE_CHECKING:
    import torch

MADE_OF_KEPT = 4096  # run versions whose line versions the trainer remembers (policy lag per policy)


def own_tensors(state: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Policy `name`'s tensors of a run version's state (`nets.<name>.` taken off)."""
    head = f"nets.{name}."
    return {key[len(head) :]: value for key, value in state.items() if key.startswith(head)}


def joined(parts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A run version's state from each policy's own tensors (the inverse of `own_tensors`)."""
    return {f"nets.{name}.{key}": value for name, own in parts.items() for key, value in own.items()}


def lines_named(meta: Mapping[str, str], policies: Sequence[str]) -> dict[str, int] | None:
    """The line versions a run version's metadata names (`lines`), one per policy of `policies`;
    None when it names none, or not one whole number per policy (then the run version's whole blob
    is the one to act with)."""
    try:
        lines = json.loads(meta["lines"])
    except (KeyError, ValueError):
        return None
    if not isinstance(lines, dict) or set(lines) != set(policies):
        return None
    if not all(type(n) is int and n >= 0 for n in lines.values()):
        return None
    return {name: lines[name] for name in policies}


class LinedStore(PolicyStore):
    """The run's store (`PolicyStore`) and a line per policy of `policies`."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        policies: Sequence[str],
        keep: int = 5,
        secret: bytes | str | None = FROM_ENV,
        on_forged: Callable[[str], None] | None = None,
    ):
        super().__init__(client, run_id, keep, secret, on_forged=on_forged)
        # A forged pointer or listing of any line is reported as one of the run's is.
        report = self.on_forged
        self.lines = {
            name: PolicyStore(client, run_id, keep, self.secret, line=name, on_forged=report) for name in policies
        }
        self._heads: dict[str, int] = {}  # each line's newest version
        self._digests: dict[str, str] = {}  # the weights of each line's newest version (sha256)
        self.made_of: dict[int, dict[str, int]] = {}  # run version -> its policies' line versions

    @property
    def on_forged(self) -> Callable[[str], None]:
        return self._on_forged

    @on_forged.setter
    def on_forged(self, report: Callable[[str], None]) -> None:
        """A forged pointer or listing of any line is reported as one of the run's is."""
        self._on_forged = report
        for line in self.__dict__.get("lines", {}).values():
            line.on_forged = report

    @property
    def heads(self) -> dict[str, int]:
        return dict(self._heads)

    def lines_of(self, version: int | str) -> dict[str, int] | None:
        """The line versions run version `version` is made of (None: not one this trainer published)."""
        return self.made_of.get(version) if isinstance(version, int) else None

    def publish(
        self,
        version: int,
        state: Mapping[str, torch.Tensor],
        algo: str,
        extra: Mapping[str, str] | None = None,
        pipe: redis.client.Pipeline | None = None,
    ) -> bytes:
        """Run version `version`, and a new version of each line whose weights changed, in one
        transaction. The run version's metadata names its line versions (`lines`)."""
        writes = self.client.pipeline(transaction=True) if pipe is None else pipe
        parts: dict[str, int] = {}
        for name, line in self.lines.items():
            own = own_tensors(state, name)
            digest = codec.tensor_digest(own)
            if digest != self._digests.get(name):
                number = self._next_number(name, line)
                line.publish(number, own, algo, {"run_version": str(version)}, pipe=writes)
                self._heads[name], self._digests[name] = number, digest
            parts[name] = self._heads[name]
        blob = super().publish(version, state, algo, {**(extra or {}), "lines": json.dumps(parts)}, pipe=writes)
        if pipe is None:
            writes.execute()
        self.made_of[version] = parts
        if len(self.made_of) > MADE_OF_KEPT:
            for old in sorted(self.made_of)[: len(self.made_of) - MADE_OF_KEPT]:
                if old not in self.pinned:
                    del self.made_of[old]
        return blob

    def _next_number(self, name: str, line: PolicyStore) -> int:
        """The number of policy `name`'s next line version: on from its last, and, at a trainer's first
        publish, past what Redis holds (versions published after the checkpoint it resumed from)."""
        number = self._heads.get(name, -1) + 1
        if line.own is None:
            latest = line.latest()
            if latest is not None and latest >= number and line.genuine(latest):
                number = latest + 1
        return number

    def _parts(self, version: int) -> dict[str, int]:
        """The line versions of run version `version`: remembered, else its checked metadata."""
        if version not in self.made_of:
            blob = self.pinned.get(version) or self.get_blob(version)
            meta = self.check(version, blob)[1]
            self.made_of[version] = {name: int(n) for name, n in json.loads(meta.get("lines", "{}")).items()}
        return self.made_of[version]

    def pin(self, version: int, holder: str = "") -> bytes:
        """Pin run version `version` and the line versions it is made of. A line version is held per
        run version (several run versions share a frozen policy's one)."""
        blob = super().pin(version, holder)
        for name, number in self._parts(version).items():
            if name in self.lines:
                self.lines[name].pin(number, f"{holder}@v{version}")
        return blob

    def unpin(self, version: int, holder: str = "") -> None:
        super().unpin(version, holder)
        for name, number in self.made_of.get(version, {}).items():
            if name in self.lines:
                self.lines[name].unpin(number, f"{holder}@v{version}")

    def restore_newest(self) -> int | None:
        for line in self.lines.values():
            line.restore_newest()
        return super().restore_newest()

    def restore_pinned(self) -> None:
        for line in self.lines.values():
            line.restore_pinned()
        super().restore_pinned()

    def forget_pins(self) -> None:
        for line in self.lines.values():
            line.forget_pins()
        super().forget_pins()

    def write_back(self) -> list[str]:
        written = [what for line in self.lines.values() for what in line.write_back()]
        return written + super().write_back()

    # ---- a resumed trainer goes on with each line's numbering --------------------------------------
    def restore_heads(self, heads: Mapping[str, int] | None) -> None:
        """Each line's newest version at the checkpoint; the first publish after it writes every line
        anew (its weights' digests are not kept), numbered on from there."""
        self._heads = {name: int(n) for name, n in (heads or {}).items() if name in self.lines}
        self._digests = {}

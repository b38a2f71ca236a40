"""The trainer's evaluations carried out (`EvaluationRunner`, an object the trainer holds): the
bookkeeping (rlfarm.evaluation.bookkeeping) decides when to evaluate, what to record, which version is
best and what to unpin; this sends the tasks, records, writes best_policy.safetensors and pins in Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlfarm.algos.group import policy_best_file, policy_tensors
from rlfarm.config import to_dict
from rlfarm.core import codec
from rlfarm.evaluation.bookkeeping import Decision, Evaluations, Record, Send, Unpin, WriteBest, WritePolicyBest
from rlfarm.runio.rundir import write_atomic

if TYPE_CHECKING:
    from rlfarm.config import RunConfig
    from rlfarm.core.protocol import Result
    from rlfarm.farm.policies.store import PolicyStore
    from rlfarm.observe.metrics import RunLogger
    from rlfarm.trainer.channel import TaskChannel


class EvaluationRunner:
    """Carries out what `evals` decides: tasks through `channel`, versions pinned in `store`, records
    through `logger()` (the run's RunLogger, opened once the run is claimed), best policies written to
    `run_dir` signed with `file_secret`."""

    def __init__(
        self,
        evals: Evaluations,
        config: RunConfig,
        store: PolicyStore,
        channel: TaskChannel,
        logger: Callable[[], RunLogger | None],
        run_dir: Path,
        file_secret: Any,
    ):
        self.evals, self.config, self.store, self.channel = evals, config, store, channel
        self.logger, self.run_dir, self.file_secret = logger, Path(run_dir), file_secret

    def start(self, version: int, env_steps: int) -> None:
        """Greedy evaluation tasks for `version`, now; results are taken in on arrival."""
        self.carry_out([self.evals.start(version, env_steps)])

    def if_due(self, env_steps: int, version: int) -> None:
        self.carry_out(self.evals.due(env_steps, version))

    def received(self, message: Result, env_steps: int) -> None:
        self.carry_out(self.evals.received(message.iteration, message.returns, env_steps, message.policy_returns))

    def final(self, env_steps: int, version: int) -> None:
        """The final policy's evaluation (every run that ends on its own has one)."""
        self.carry_out(self.evals.final(env_steps, version))

    def policy_summaries(self) -> dict[str, dict[str, Any]]:
        """summary.json's `policies` (several policies): each one's last and best evaluation and its
        best_policy.<policy>.safetensors."""
        out = {}
        for name, (version, score) in self.evals.policy_best.items():
            path = self.run_dir / policy_best_file(name)
            out[name] = {
                "eval_mean_return": self.evals.policy_mean.get(name),
                "best_eval_mean_return": score,
                "best_version": version,
                "best_policy": str(path) if path.exists() else None,
            }
        return out

    def carry_out(self, decisions: list[Decision]) -> None:
        """Do what the evaluation bookkeeping decided, in its order."""
        for decision in decisions:
            if isinstance(decision, Send):
                self.store.pin(decision.version)  # retention must not trim it while its tasks run
                lines = self.store.lines_of(decision.version)  # several policies: each one's own version
                for spec in decision.tasks:
                    self.channel.submit(replace(spec, lines=lines) if lines else spec)
            elif isinstance(decision, Record):
                self.logger().evaluation(
                    decision.env_steps,
                    decision.returns,
                    decision.version,
                    confirmation=decision.confirmation,
                    by_policy=decision.by_policy,
                )
            elif isinstance(decision, WriteBest):
                self._write_best(decision.version, decision.score)
            elif isinstance(decision, WritePolicyBest):
                self._write_best(decision.version, decision.score, policy=decision.policy)
            elif isinstance(decision, Unpin):
                self.store.unpin(decision.version)
            else:
                raise TypeError(f"not an evaluation decision: {decision!r}")

    def _write_best(self, version: int, score: float, policy: str | None = None) -> None:
        """`version` to best_policy.safetensors, or its policy `policy` alone (its network's tensors,
        as a single policy's file: a frozen policy or `rlfarm eval --policy-for` takes it) to
        best_policy.<policy>.safetensors."""
        # The pinned blob is the trainer's own copy or one that passed the store's checks; verified
        # again here, since it is re-signed below (rlfarm.farm.policies.store.PolicyStore.pin).
        state, meta = codec.decode_policy(self.store.pin(version), self.store.secret)
        if policy is not None:
            state = policy_tensors(state, policy)
            meta["policy_name"] = policy
        meta.update(
            {
                "env": self.config.env.id,
                "policy": json.dumps(to_dict(self.config)["policy"]),
                "env_options": json.dumps(to_dict(self.config)["env"]),
                "eval_mean_return": f"{score:.3f}",
            }
        )
        meta.pop("hmac", None)
        blob = codec.encode_policy(state, meta, self.file_secret)
        write_atomic(self.run_dir / (policy_best_file(policy) if policy else "best_policy.safetensors"), blob)

    def drain(self, env_steps: int, unused: Callable[[Result], None]) -> None:
        """Wait for evaluation tasks still in flight (confirmations they start included), so the
        run's last evaluation is recorded. Rollouts still out (ASYNC) that arrive meanwhile go to
        `unused`."""
        while self.channel.outstanding("eval"):  # held back for the run's share included
            message = self.channel.next_result(timeout=1.0)
            if message is None:
                continue
            if message.kind == "eval":
                self.received(message, env_steps)
            else:
                unused(message)

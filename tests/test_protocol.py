"""TaskSpec and Result: the one definition of a task's fields and a result's, and their wire forms."""

from __future__ import annotations

import numpy as np
import pytest

from rlfarm.core import codec, signing
from rlfarm.core.protocol import EVAL_TASK, PROTOCOL, ROLLOUT_TASK, Result, TaskSpec, protocol_mismatch, spec_protocol
from rlfarm.errors import EnvFault, ProtocolError

SECRET = "test-secret-with-enough-entropy-0123456789"


def test_task_spec_round_trips_through_celery_kwargs_and_msgpack():
    spec = TaskSpec(
        "run-1",
        "rollout",
        12,
        1,
        "latest",
        7,
        steps=256,
        act={"epsilon": 0.05, "keep_next_obs": True},
        env="CartPole-v1",
    )
    kwargs = spec.to_kwargs()
    assert kwargs == {
        "run": "run-1",
        "kind": "rollout",
        "iteration": 12,
        "index": 1,
        "version": "latest",
        "seed": 7,
        "steps": 256,
        "act": {"epsilon": 0.05, "keep_next_obs": True},
        "env": "CartPole-v1",
        "protocol": PROTOCOL,
    }
    assert TaskSpec.from_kwargs(codec.unpack(codec.pack(kwargs))) == spec
    assert spec.key == ("rollout", 12, 1) and spec.task_name == ROLLOUT_TASK
    assert spec.acting_options() == {"epsilon": 0.05}  # collect options are the worker's, not the actor's
    # Algorithm options travel nested, and the signature covers them like every other field.
    signed = signing.sign_spec(kwargs, SECRET)
    assert TaskSpec.from_kwargs(signing.verify_spec(codec.unpack(codec.pack(signed)), SECRET)) == spec
    with pytest.raises(signing.SignatureError):
        signing.verify_spec({**signed, "act": {"epsilon": 1.0, "keep_next_obs": True}}, SECRET)


def test_labels_are_short_and_name_the_task():
    rollout = TaskSpec("cartpole-1", "rollout", 12, 1, "latest", 1, steps=256, act={"epsilon": 0.05}, env="CartPole-v1")
    assert rollout.label() == "run=cartpole-1 v=latest it=12 idx=1 steps=256 seed=1 eps=0.05 env=CartPole-v1"
    evaluation = TaskSpec("cartpole-1", "eval", 3, 0, 40, 1_000_004, episodes=5)
    assert evaluation.label() == "run=cartpole-1 v=40 it=3 idx=0 episodes=5 seed=1000004"
    assert evaluation.task_name == EVAL_TASK


def test_bad_task_specs_are_one_clear_error():
    with pytest.raises(ProtocolError, match=r"unknown fields \['epsilon'\]"):
        TaskSpec.from_kwargs({"run": "r", "iteration": 0, "index": 0, "version": 0, "seed": 1, "epsilon": 0.1})
    with pytest.raises(ProtocolError, match=r"lacks fields \['seed', 'version'\]"):
        TaskSpec.from_kwargs({"run": "r", "iteration": 0, "index": 0})
    with pytest.raises(ProtocolError, match="task kind must be one of rollout, eval"):
        TaskSpec("r", "train", 0, 0, 0, 1)


def test_result_messages_keep_set_fields_only_and_read_back():
    result = Result(
        "eval", 4, 1, task_id="abc", worker="host:1", version=0, duration=0.5, returns=np.array([500.0, 480.0])
    )
    message = codec.unpack(codec.pack(result.to_message()))
    assert set(message) == {"kind", "iteration", "index", "task_id", "worker", "version", "duration", "returns"}
    back = Result.from_message(message)
    assert back.key == ("eval", 4, 1) and back.version == 0 and back.returns.tolist() == [500.0, 480.0]
    assert not back.skipped and back.error is None
    # A worker's timings travel as a plain map; a trainer without the field would drop it unread.
    timed = Result("rollout", 0, 0, duration=0.5, timings={"checks": 0.001, "policy": 0.002, "collect": 0.498})
    assert Result.from_message(codec.unpack(codec.pack(timed.to_message()))).timings == timed.timings


def test_a_task_of_another_protocol_is_refused_in_one_line_naming_both_versions():
    assert spec_protocol(TaskSpec("r", "rollout", 0, 0, 0, 1).to_kwargs()) == PROTOCOL
    assert spec_protocol({"run": "r", "iteration": 0}) == 0  # sent by a trainer before versions
    assert protocol_mismatch(PROTOCOL, "w@h") is None
    newer = protocol_mismatch(PROTOCOL + 1, "w@h")
    assert f"worker w@h speaks rlfarm protocol {PROTOCOL}, the task protocol {PROTOCOL + 1}" in newer
    assert "upgrade this worker" in newer and "\n" not in newer
    assert "(sent before protocol versions)" in protocol_mismatch(0, "w@h")


@pytest.mark.parametrize("name", ["", "Crash", "9lives", "simulator crash", "a" * 41, "x-y"])
def test_an_env_fault_is_named_as_a_counter_is(name):
    """EnvFault's name becomes a key of summary.json's faults.reported: refused when it could not be one."""
    with pytest.raises(ValueError, match="EnvFault's name must match"):
        EnvFault(name)
    assert EnvFault("simulator_crash", "lost its license").name == "simulator_crash"
    assert str(EnvFault("a" * 40)) == "a" * 40


def test_a_failed_copy_carries_its_envs_fault_name():
    message = Result("rollout", 3, 1, error="EnvFault: gpu_lost", retryable=True, fault="gpu_lost")
    back = Result.from_message(codec.unpack(codec.pack(message.to_message())))
    assert back.fault == "gpu_lost" and back.outcome.value == "failed" and back.retryable

"""The TensorBoard scalars a farm run promises (README, CLI reference), read back from the event files."""

from __future__ import annotations

import pytest

from .conftest import run_cli, scalar_tags

pytestmark = pytest.mark.farm

FARM_SCALARS = {
    "farm/policy_lag",
    "farm/tasks_in_flight",
    "farm/queue_depth",
    "farm/results_dropped",
    "farm/redispatched",
}


@pytest.mark.parametrize(
    "args",
    [
        ["--preset", "cartpole-ppo", "--total-steps", "8192"],
        ["--preset", "cartpole-dqn", "--mode", "async", "--total-steps", "3000", "--target-return", "1e9"],
    ],
    ids=["sync", "async"],
)
def test_farm_scalars_are_in_tensorboard(tmp_path, args):
    result = run_cli("train", "--run-id", "tb", "--logdir", str(tmp_path), "--workers", "2", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    tags = scalar_tags(tmp_path / "tb")
    assert FARM_SCALARS <= set(tags), FARM_SCALARS - set(tags)
    assert {"charts/episodic_return", "charts/SPS"} <= set(tags)
    assert all(v >= 0 for key in FARM_SCALARS for v in tags[key])
    if "async" in args:
        assert "histogram:farm/policy_lag_distribution" in tags
        assert max(tags["farm/policy_lag"]) > 0  # tasks act with versions older than the trainer's
    else:
        assert set(tags["farm/policy_lag"]) == {0.0}  # SYNC tasks act with the version being trained

"""Upper bounds on every number that starts processes or allocates memory (rlfarm.sections.bounds): config
keys at their bound accepted and above it refused in one line naming key, value and bound; learning
rates; the CLI's options; `--seeds` capped before a range is expanded, printed compactly, and trained
in waves of at most --parallel trainers (rlfarm.tune.seeds, with stand-in trainers: unit tier)."""

from __future__ import annotations

import math
import tracemalloc
import types

import pytest
from click.testing import CliRunner

from rlfarm import config as C
from rlfarm.config.seeds import compact_seeds, parse_seeds
from rlfarm.sections import bounds as B
from rlfarm.tune import seeds as S

# (preset, key, bound, other keys that let the value at the bound make a valid config)
SMALL_TASK = {"env.num_envs": 1, "farm.steps_per_env": 64}
KEYS = [
    ("cartpole-ppo", "env.num_envs", B.MAX_NUM_ENVS, {"farm.steps_per_env": 64}),
    ("cartpole-ppo", "farm.steps_per_env", B.MAX_STEPS_PER_ENV, {"env.num_envs": 1, "ppo.num_minibatches": 4}),
    ("cartpole-ppo", "farm.num_tasks", B.MAX_TASKS, SMALL_TASK),
    ("cartpole-ppo", "farm.workers", B.MAX_WORKERS, {}),
    ("cartpole-ppo", "torch_threads", B.MAX_WORKERS, {}),
    ("cartpole-ppo", "async.tasks_in_flight", B.MAX_TASKS, {"mode": "async"}),
    ("cartpole-ppo", "async.results_per_update", B.MAX_TASKS, {"mode": "async"}),
    ("cartpole-ppo", "eval.tasks", B.MAX_TASKS, {}),
    ("cartpole-ppo", "eval.episodes", B.MAX_EPISODES, {}),
    ("cartpole-ppo", "eval.confirm_episodes", B.MAX_EPISODES, {}),
    ("cartpole-ppo", "farm.keep_versions", B.MAX_KEEP_VERSIONS, {}),
    ("cartpole-ppo", "farm.max_result_bytes", B.MAX_RESULT_BYTES, {}),
    ("cartpole-ppo", "env.frame_stack", B.MAX_FRAME_STACK, {}),
    ("cartpole-ppo", "env.screen_size", B.MAX_SCREEN_SIZE, {}),
    ("cartpole-ppo", "policy.cnn_features", B.MAX_LAYER_WIDTH, {}),
    ("cartpole-no-vel-lstm", "policy.recurrent_size", B.MAX_LAYER_WIDTH, {}),
    ("cartpole-ppo", "policy.hidden_sizes", B.MAX_LAYER_WIDTH, {}),
    ("cartpole-ppo", "policy.cnn_channels", B.MAX_LAYER_WIDTH, {}),
    ("cartpole-appo", "ppo.buffer_batches", B.MAX_BUFFER_BATCHES, {}),
    ("cartpole-ppo", "ppo.update_epochs", B.MAX_PASSES, {}),
    ("cartpole-appo", "ppo.batch_passes", B.MAX_PASSES, {}),
    *(
        (preset, f"{algo}.{key}", bound, {})
        for preset, algo in (("cartpole-dqn", "dqn"), ("pendulum-sac", "sac"), ("pendulum-td3", "td3"))
        for key, bound in (("buffer_size", B.MAX_BUFFER_SIZE), ("batch_size", B.MAX_BATCH_SIZE))
    ),
]


def build(preset: str, key: str, value: int, extra: dict) -> C.RunConfig:
    if key == "policy.hidden_sizes":
        value = [64, value]
    elif key == "policy.cnn_channels":
        value = [value, 64, 64]
    return C.from_flat({**C.load_preset(preset), **extra, key: value})


@pytest.mark.parametrize("preset, key, bound, extra", KEYS, ids=[k[1] for k in KEYS])
def test_a_key_at_its_bound_is_accepted_and_above_it_refused_in_one_line(preset, key, bound, extra):
    build(preset, key, bound, extra)
    with pytest.raises(C.ConfigError) as err:
        build(preset, key, bound + 1, extra)
    message = str(err.value)
    assert "\n" not in message and f"{key} = {bound + 1:,} is above its bound of {bound:,}" in message


@pytest.mark.parametrize("preset, algo", [("cartpole-dqn", "dqn"), ("pendulum-sac", "sac"), ("pendulum-td3", "td3")])
def test_gradient_steps_per_env_step_are_bounded(preset, algo):
    C.build(preset, [f"{algo}.replay_ratio={B.MAX_REPLAY_RATIO}"])
    with pytest.raises(C.ConfigError, match=rf"{algo}.replay_ratio = 256.5 is above its bound of 256 "):
        C.build(preset, [f"{algo}.replay_ratio=256.5"])


def test_a_policys_own_settings_meet_the_same_bounds():
    """`policy_settings` per policy: 1e9 epochs for one agent spun its learner until killed."""
    with pytest.raises(C.ConfigError, match="policy_settings of policy 'agent': ppo.update_epochs = 1,001 is above"):
        C.build("tag-ppo", ["policy_settings=['agent:ppo.update_epochs=1001']"])
    C.build("tag-ppo", ["policy_settings=['agent:ppo.update_epochs=1000']"])


def test_a_task_and_a_sync_iteration_are_bounded_in_env_steps():
    at = {"env.num_envs": 1024, "farm.steps_per_env": 1024, "farm.num_tasks": 1, "ppo.num_minibatches": 4}
    assert C.build("cartpole-ppo", [f"{k}={v}" for k, v in at.items()]).steps_per_iteration == B.MAX_BATCH_STEPS
    with pytest.raises(C.ConfigError, match="a task of env.num_envs x farm.steps_per_env = 1,024 x 1,025"):
        C.build("cartpole-ppo", ["env.num_envs=1024", "farm.steps_per_env=1025", "ppo.num_minibatches=1"])
    with pytest.raises(C.ConfigError, match="a SYNC iteration .* = 1,048,704 env steps is above its bound"):
        C.build("cartpole-ppo", ["env.num_envs=2", "farm.steps_per_env=64", "farm.num_tasks=8193"])
    with pytest.raises(C.ConfigError, match="policy.hidden_sizes has 65 layers, above its bound of 64"):
        C.build("cartpole-ppo", ["policy.hidden_sizes=[" + ", ".join(["8"] * 65) + "]"])


def test_the_audits_config_is_refused():
    with pytest.raises(C.ConfigError, match=r"^env.num_envs = 100,000 is above its bound of 4,096"):
        C.build("cartpole-ppo", ["env.num_envs=100000"])
    with pytest.raises(C.ConfigError, match=r"^ppo.learning_rate = 1e\+06 is outside \(0, 1\]"):
        C.build("cartpole-ppo", ["ppo.learning_rate=1e6"])


@pytest.mark.parametrize("preset", ["cartpole-ppo", "cartpole-dqn", "pendulum-sac", "pendulum-td3"])
@pytest.mark.parametrize("value", [0.0, -1e-3, 1.5, 1e6, math.nan])
def test_every_algorithms_learning_rate_is_in_0_to_1(preset, value):
    algo = C.build(preset).algo
    assert C.from_flat({**C.load_preset(preset), f"{algo}.learning_rate": 1.0}).algo_config.learning_rate == 1.0
    with pytest.raises(C.ConfigError, match=rf"^{algo}.learning_rate = .* is outside \(0, 1\]"):
        C.from_flat({**C.load_preset(preset), f"{algo}.learning_rate": value})


def test_every_shipped_preset_is_within_the_bounds():
    for name in C.preset_names():
        C.build(name)


def test_a_replay_buffer_larger_than_the_machines_memory_is_refused():
    cfg = C.build("cartpole-dqn", ["dqn.buffer_size=1000000"])
    gib = 2**30
    C.check_replay_memory(cfg, (84, 84, 4), True, 1, 64 * gib)  # 1M Atari frames stacks: 52.6 GiB
    with pytest.raises(
        C.ConfigError,
        match=r"^dqn.buffer_size = 1,000,000 transitions of 84x84x4 observations "
        r"need about 52.6 GiB, more than this machine's 16.0 GiB",
    ):
        C.check_replay_memory(cfg, (84, 84, 4), True, 1, 16 * gib)
    C.check_replay_memory(C.build("cartpole-ppo"), (84, 84, 4), True, 1, gib)  # no replay: nothing to check


def test_seeds_above_the_cap_are_refused_before_a_range_is_expanded():
    assert len(parse_seeds(f"1-{B.MAX_SEEDS}")) == B.MAX_SEEDS
    tracemalloc.start()
    try:
        with pytest.raises(C.ConfigError) as err:
            parse_seeds("1-100000")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == (
        "the range 1-100000 is 100,000 seeds, more than the 1,000 one command may train "
        "(each is a trainer process and a run directory)"
    )
    assert peak < 100_000  # a list of 100,000 ints alone is 800 kB
    with pytest.raises(C.ConfigError, match="is 10,000,000,000,000,000,000,000 seeds"):  # would never end
        parse_seeds("0-9999999999999999999999")
    with pytest.raises(C.ConfigError, match="^more than the 1,000 seeds one command may train"):
        parse_seeds("1-600,1000-1600")
    assert len(parse_seeds("1-1000,1-1000")) == 1000  # the same seeds twice are 1000


@pytest.mark.parametrize(
    "seeds, text",
    [
        ([1, 2], "1-2"),
        ([1, 2, 3, 5, 8, 10, 11, 12], "1-3, 5, 8, 10-12"),
        ([5, 3, 4, 0], "5, 3-4, 0"),
        (list(range(1, 1001)), "1-1000"),
        ([7], "7"),
    ],
)
def test_seeds_print_compactly_and_read_back(seeds, text):
    assert compact_seeds(seeds) == text
    if len(seeds) > 1:
        assert parse_seeds(text) == seeds


def test_compact_seeds_round_trips_what_parse_seeds_returns():
    for text in ("1-5,8,10-12", "3,1-2,3", "9,8,7", "0,2,4-6,5,100-140,7"):
        seeds = parse_seeds(text)
        assert parse_seeds(compact_seeds(seeds)) == seeds


def error_line(args: list[str]) -> str:
    from cli import main

    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("rlfarm: error: ")
    return line


def test_train_seeds_1_100000_is_one_line_and_starts_nothing(tmp_path):
    """Unit tier: a trainer started here would fail the test (conftest), and nothing is written."""
    line = error_line(["train", "--seeds", "1-100000", "--total-steps", "512", "--logdir", str(tmp_path)])
    assert "the range 1-100000 is 100,000 seeds, more than the 1,000" in line
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["worker", "-c", "1025"], "'-c' / '--concurrency': 1025 is not in the range 1<=x<=1024"),
        (["up", "-w", "1025"], "'-w' / '--workers': 1025 is not in the range 1<=x<=1024"),
        (["train", "--workers", "1025"], "'--workers': 1025 is not in the range 1<=x<=1024"),
        (["train", "--seeds", "1-3", "--parallel", "65"], "'--parallel': 65 is not in the range 1<=x<=64"),
        (["train", "--parallel", "2"], "--parallel is how many seeds train at once; give it with --seeds"),
        (["sweep", "--parallel", "65"], "'--parallel': 65 is not in the range 1<=x<=64"),
        (["sweep", "--trials", "10001"], "'--trials': 10001 is not in the range 1<=x<=10000"),
        (["sweep", "--workers", "1025"], "'--workers': 1025 is not in the range 1<=x<=1024"),
        (["eval", "--episodes", "10001"], "'--episodes': 10001 is not in the range 1<=x<=10000"),
        (
            ["train", "--set", "env.num_envs=100000", "--set", "ppo.learning_rate=1e6"],
            "env.num_envs = 100,000 is above its bound of 4,096",
        ),
    ],
)
def test_cli_numbers_above_their_bounds_are_one_line(args, fragment):
    assert fragment in error_line(args)


class FakeTrainer:
    """Stands in for a trainer subprocess: exits (status 0) on its `polls`-th poll; counts who runs at once."""

    running: list[FakeTrainer] = []
    most = 0
    fail_at: int | None = None  # the seed whose start raises BlockingIOError (a pids limit)

    def __init__(self, args, log, env):
        seed = int(args[args.index("--seed") + 1])
        if seed == FakeTrainer.fail_at:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        self.code, self.polls, self.stopped = None, 2, False
        FakeTrainer.running.append(self)
        FakeTrainer.most = max(FakeTrainer.most, len(FakeTrainer.running))
        self.seconds = 1.0

    def poll(self):
        if self.code is None:
            self.polls -= 1
            if self.polls <= 0:
                self.code = 0
                FakeTrainer.running.remove(self)
        return self.code

    def failure(self):
        return "stopped"


@pytest.fixture
def fake_trainers(monkeypatch):
    FakeTrainer.running, FakeTrainer.most, FakeTrainer.fail_at = [], 0, None
    stopped = []

    def stop_all(trainers):
        for t in trainers:
            if t.code is None:
                t.code, t.stopped = -15, True
                FakeTrainer.running.remove(t)
                stopped.append(t)

    monkeypatch.setattr(S, "TrainerProcess", FakeTrainer)
    monkeypatch.setattr(S, "stop_all", stop_all)
    monkeypatch.setattr(S, "time", types.SimpleNamespace(time=__import__("time").time, sleep=lambda s: None))
    monkeypatch.setattr(S, "_scores", lambda run_dir: {})
    return stopped


@pytest.mark.parametrize("parallel", [1, 2, 3])
def test_seeds_run_in_waves_of_at_most_parallel(fake_trainers, tmp_path, parallel):
    runs = S.run_seeds([], list(range(1, 8)), "b", tmp_path, {}, tmp_path, parallel)
    assert FakeTrainer.most == parallel and [r.state for r in runs] == ["finished"] * 7
    assert all(r.started_at <= r.ended_at for r in runs)
    if parallel == 1:  # each seed starts after the one before it ended
        assert all(a.ended_at <= b.started_at for a, b in zip(runs, runs[1:]))


def test_a_trainer_that_cannot_be_forked_stops_the_others(fake_trainers, tmp_path):
    FakeTrainer.fail_at = 3
    with pytest.raises(S.StartFailed) as err:
        S.run_seeds([], [1, 2, 3, 4], "b", tmp_path, {}, tmp_path, 4)
    assert str(err.value) == (
        "could not start the trainer of seed 3 (Resource temporarily unavailable); the 2 running were stopped"
    )
    assert len(fake_trainers) == 2 and FakeTrainer.running == []


def test_a_fork_failure_under_train_seeds_is_one_line(tmp_path, monkeypatch):
    """What the user sees when the process limit stops a trainer's start: one line, exit 1 (the farm is
    stood in for; unit tier, so nothing is started)."""
    import contextlib

    from cli import main
    from rlfarm.local import shared

    def run_seeds(args, seeds, base, logdir, env, seeds_dir, parallel):
        assert parallel == 2
        raise S.StartFailed(3, BlockingIOError(11, "Resource temporarily unavailable"), 2)

    monkeypatch.setattr(shared, "farm_for_trainers", lambda *a, **k: contextlib.nullcontext({}))
    monkeypatch.setattr(S, "run_seeds", run_seeds)
    result = CliRunner().invoke(main, ["train", "--seeds", "1-4", "--parallel", "2", "--logdir", str(tmp_path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert [line for line in result.output.splitlines() if "error" in line] == [
        "rlfarm: error: could not start the trainer of seed 3 (Resource temporarily unavailable); the 2 running "
        "were stopped; this machine's process limit (ulimit -u, a container's pids limit) or memory is reached: "
        "lower --parallel (it was 2)"
    ]


def test_an_env_id_longer_than_any_is_refused_without_echoing_it():
    """A 50 MB env.id came back as one 50 MB error line."""
    C.build("cartpole-ppo", ["env.id=CartPole-v1"])
    with pytest.raises(C.ConfigError, match="env.id is 5,000,000 characters long, above its bound of 256") as err:
        C.from_flat({**C.load_preset("cartpole-ppo"), "env.id": "x" * 5_000_000})
    assert len(str(err.value)) < 200


def test_a_worker_refuses_an_overlong_env_id_without_echoing_it():
    """An id read from Redis meets the same bound where the env is built (rlfarm.envs.make)."""
    from rlfarm.envs import make_env
    from rlfarm.errors import EnvError

    with pytest.raises(EnvError, match="an env id of 1,000,000 characters, above its bound of 256") as err:
        make_env("x" * 1_000_000)
    assert len(str(err.value)) < 100


def test_the_env_id_bound_is_256_characters():
    at = {**C.load_preset("cartpole-ppo"), "env.id": "x" * B.MAX_ENV_ID_CHARS}
    assert C.from_flat(at).env.id == "x" * 256  # the config accepts it (the env is checked later)
    with pytest.raises(C.ConfigError, match="env.id is 257 characters long"):
        C.from_flat({**at, "env.id": "x" * 257})

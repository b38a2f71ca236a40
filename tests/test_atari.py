"""Atari through the farm: DeepMind's preprocessing on the workers, the Nature CNN, game scores.
Needs the atari extra (`pip install -e ".[atari]"`; .ci/run installs it)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rlfarm.config import machine_cores

from .conftest import read_csv, run_cli

ale_py = pytest.importorskip("ale_py", reason='the atari extra is not installed: pip install -e ".[atari]"')
pytest.importorskip("cv2", reason='the atari extra is not installed (OpenCV): pip install -e ".[atari]"')


def test_preprocessing_makes_stacked_84x84_grayscale_uint8_frames():
    from rlfarm.envs import describe, make_vector_env

    spec = describe("ALE/Pong-v5")
    assert spec.obs_shape == (4, 84, 84) and spec.obs_dtype == "uint8" and spec.is_image
    assert spec.image_layout == "CHW" and spec.discrete and spec.action_dim == 6
    envs = make_vector_env("ALE/Pong-v5", 2, trusted=False)  # a registered id: no allowlist needed
    obs, _ = envs.reset(seed=[1, 2])
    for _ in range(60):  # past the first second, in which nothing moves
        obs, reward, *_ = envs.step(np.zeros(2, np.int64))
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    assert not np.array_equal(obs[0, 0], obs[0, 3])  # four different frames, oldest first
    envs.close()


def test_a_lost_life_is_signalled_without_ending_the_game():
    from rlfarm.envs import make_env

    env = make_env("ALE/Breakout-v5", options={"terminal_on_life_loss": True})
    env.reset(seed=3)
    lives, lost, steps = env.unwrapped.ale.lives(), 0, 0
    terminated = truncated = False
    while not (terminated or truncated):
        _, _, terminated, truncated, info = env.step(1)  # FIRE: serve and let the ball go by
        steps += 1
        now = env.unwrapped.ale.lives()
        assert info["life_lost"] == (now < lives and not terminated)
        lost += info["life_lost"]
        lives = now
    assert lost == 4 and terminated  # five lives: four lost in play, the game over ends the episode
    env.close()


def test_pong_preset_trains_through_the_cli_with_the_cnn_and_reports_game_scores(farm, tmp_path):
    """A few thousand steps of the `pong` preset on real workers: finite losses, the CNN learner, and
    whole games (longer than a task: "continue" episodes) reported in game score."""
    r = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--preset",
        "pong",
        "--total-steps",
        "4096",
        "--set",
        "env.num_envs=2",
        "--set",
        "eval.episodes=2",  # the final evaluation: 2 games, not 10
        "--run-id",
        "pong",
        "--logdir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "pong" / "summary.json").read_text())
    # A farm given by --redis runs no worker of this run's on the trainer's machine: the CNN's
    # learner takes every core (torch_threads "auto").
    assert summary["trainer_threads"] == machine_cores()
    rows = [row for row in read_csv(tmp_path / "pong" / "progress.csv") if int(row["policy_version"]) > 0]
    losses = [float(row["losses/value_loss"]) for row in rows] + [float(row["losses/policy_loss"]) for row in rows]
    assert rows and all(math.isfinite(x) for x in losses)
    episodes = read_csv(tmp_path / "pong" / "episodes.csv")
    assert episodes, "no whole game reported"
    for e in episodes:
        score = float(e["episodic_return"])
        assert score == int(score) and -21 <= score <= 21  # points, as the game counts them
        assert int(e["episodic_length"]) > 128  # a whole game: longer than one 128-step task


def _wrapper_chain(env_id: str, num_envs: int, options: dict):
    """The gymnasium wrapper chain as a vector env: what AleVector must compute."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from rlfarm.envs import make_env

    return SyncVectorEnv([lambda: make_env(env_id, options=options)] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)


@pytest.fixture
def short_games():
    """ALE ids whose episodes are cut after a few hundred frames: episode ends every few steps."""
    import gymnasium as gym

    from rlfarm.envs.atari import register

    register()
    ids = {}
    for base, frames in (("ALE/Pong-v5", 400), ("ALE/Breakout-v5", 1200)):
        ids[base] = f"ALE/RlfarmTest{base[4:-3]}{frames}-v5"  # an ALE/ id: make_env preprocesses it
        gym.register(
            ids[base],
            entry_point=gym.registry[base].entry_point,
            kwargs={**gym.registry[base].kwargs, "max_num_frames_per_episode": frames},
        )
    yield ids
    for env_id in ids.values():
        del gym.registry[env_id]


def _same_step(a: tuple, b: tuple, step: int, chain: bool = False) -> None:
    """Two vector envs' step results are the same: observations, rewards, dones, and the info
    `collect` reads (from a SyncVectorEnv: the ended rows' values in final_info, final_obs per row)."""
    names = ("observations", "rewards", "terminations", "truncations")
    for name, x, y in zip(names, a[:4], b[:4]):
        assert x.dtype == y.dtype and np.array_equal(x, y), f"{name} differ at step {step}"
    info, other = a[4], b[4]
    done = a[2] | a[3]
    for key in ("raw_reward", "life_lost"):
        assert (key in info) == (key in other or key in other.get("final_info", {})), key
        if key in info:
            theirs = other.get(key, np.zeros_like(info[key]))
            if chain and done.any():  # the chain's rows that reset carry the reset's info
                theirs = np.where(done, other["final_info"][key], theirs)
            assert np.array_equal(info[key], theirs), f"info[{key!r}] differs at step {step}"
    assert ("final_obs" in info) == done.any() == ("final_obs" in other)
    for i in np.flatnonzero(done):
        assert np.array_equal(info["final_obs"][i], other["final_obs"][i]), f"final_obs differs at step {step}"
    if not chain:
        assert info.keys() == other.keys()


def test_tasks_step_ale_vector_with_the_wrapper_chains_frames_from_the_reset_on(short_games):
    """make_vector_env takes AleVector for ALE ids: from the reset on (no-op starts, sticky actions of
    ALE/*-v5) it computes what the wrapper chain computes with the same seeds, bit for bit: frames,
    rewards, game scores, lost lives, episode ends, final observations and the resets after them."""
    from rlfarm.envs import make_vector_env
    from rlfarm.envs.ale_vector import AleVector

    cases = [
        ("ALE/Pong-v5", {"noop_max": 30}, [5, 6], 300),  # sticky actions, no-op starts
        ("PongNoFrameskip-v4", {"noop_max": 0, "frame_stack": 2, "clip_rewards": False}, 9, 150),
        ("PongNoFrameskip-v4", {"noop_max": 30, "screen_size": 42}, [7, 8], 150),  # the pong-appo preset's frames
        (short_games["ALE/Pong-v5"], {"noop_max": 30}, 2**32 - 1, 250),  # cut every ~100 steps
        (short_games["ALE/Breakout-v5"], {"noop_max": 30, "terminal_on_life_loss": True}, [3, 4], 400),
    ]
    for env_id, options, seed, steps in cases:
        ale = make_vector_env(env_id, 2, trusted=False, options=options)
        assert isinstance(ale, AleVector)
        chain = _wrapper_chain(env_id, 2, options)
        assert ale.single_observation_space == chain.single_observation_space
        assert ale.single_action_space == chain.single_action_space and ale.action_space == chain.action_space
        a, _ = ale.reset(seed=seed)
        b, _ = chain.reset(seed=seed)
        assert a.dtype == b.dtype == np.uint8 and np.array_equal(a, b)
        rng = np.random.default_rng(0)
        scored, ends, lost = 0.0, 0, 0
        for t in range(steps):
            actions = rng.integers(0, ale.single_action_space.n, 2)
            result = ale.step(actions)
            _same_step(result, chain.step(actions), t, chain=True)
            scored += float(np.abs(result[4]["raw_reward"]).sum())
            ends += int((result[2] | result[3]).sum())
            lost += int(result[4].get("life_lost", np.zeros(2)).sum())
        assert scored > 0, env_id  # points were scored: rewards were compared
        if env_id in short_games.values():
            assert ends >= 4, env_id  # episode ends and the resets after them were compared
        if options.get("terminal_on_life_loss"):
            assert lost >= 4
        ale.close()
        chain.close()


def test_ale_vector_signals_lost_lives_and_hands_over_final_observations():
    """Breakout with terminal_on_life_loss: a life lost is flagged while the game goes on; an
    episode cut by the frame cap leaves its real last frames in final_obs."""
    import gymnasium as gym

    from rlfarm.envs.ale_vector import AleVector

    envs = AleVector("ALE/Breakout-v5", 2, {"terminal_on_life_loss": True, "noop_max": 0})
    envs.reset(seed=[1, 2])
    lost = np.zeros(2, int)
    ended = np.zeros(2, bool)
    for _ in range(5000):
        obs, reward, terminated, truncated, info = envs.step(np.ones(2, np.int64))  # FIRE, then idle
        assert not (info["life_lost"] & (terminated | truncated)).any()
        lost += np.where(ended, 0, info["life_lost"])
        ended |= terminated
        if ended.all():
            break
    assert ended.all() and (lost == 4).all()  # five lives: four lost in play, the fifth ends the game
    envs.close()

    cap = gym.registry["ALE/Pong-v5"].kwargs.get("max_num_frames_per_episode")
    assert cap  # the registered cap is what AleVector sets; a short one to see truncation:
    gym.register(
        "rlfarm-test/PongShort-v5",
        entry_point=gym.registry["ALE/Pong-v5"].entry_point,
        kwargs={**gym.registry["ALE/Pong-v5"].kwargs, "max_num_frames_per_episode": 400},
    )
    try:
        short = AleVector("rlfarm-test/PongShort-v5", 2, {"noop_max": 0})
        short.reset(seed=[1, 2])
        for step in range(1, 200):  # noqa: B007 - read after the loop: the step the game was cut at
            obs, _, terminated, truncated, info = short.step(np.zeros(2, np.int64))
            if truncated.any():
                break
        assert truncated.all() and not terminated.any() and step == 100  # 400 frames, 4 a step
        assert info["final_obs"].shape == (2, 4, 84, 84)
        assert not np.array_equal(info["final_obs"], obs)  # the cut game's frames, not the reset's
        short.close()
    finally:
        del gym.registry["rlfarm-test/PongShort-v5"]


def _through_codec(snapshot: dict, compress: str = "none") -> dict:
    """A snapshot as it would come back from storage: packed and unpacked by rlfarm's codec (no pickle)."""
    from rlfarm.core import codec

    return codec.unpack(codec.pack(snapshot, compress=compress))


def test_a_snapshot_restored_into_a_fresh_ale_vector_goes_on_bit_for_bit():
    """3,000 steps of random play on ALE/Pong-v5 (sticky actions, no-op starts, whole games ending):
    a snapshot, through the codec, restored into a freshly made AleVector (never reset) continues
    exactly as the original: right after the reset, mid-game, right after an autoreset. Every 50 steps
    the original's snapshot also moves into a second AleVector that sat idle since its own restore,
    whose emulators last took other actions: the action a sticky repeat replays, which ALE's saved
    state lacks, must come back too (restoring ALE's state alone fails this within a few hundred steps)."""
    from rlfarm.envs.ale_vector import AleVector

    options = {"noop_max": 30}
    make = lambda: AleVector("ALE/Pong-v5", 2, options)  # noqa: E731
    original = make()
    original.reset(seed=[11, 12])
    follower, idle = make(), make()
    follower.restore(_through_codec(original.snapshot()))
    rng = np.random.default_rng(3)
    ends, fresh_restores, after_end = 0, 1, False
    for t in range(3000):
        actions = rng.integers(0, 6, 2)
        result = original.step(actions)
        _same_step(result, follower.step(actions), t)
        done = result[2] | result[3]
        ends += int(done.sum())
        if t == 700 or (done.any() and not after_end):  # mid-game; right after the first autoreset
            after_end = after_end or bool(done.any())
            follower = make()
            fresh_restores += 1
        elif t % 50 == 49:
            follower, idle = idle, follower
        else:
            continue
        snapshot = original.snapshot()
        follower.restore(_through_codec(snapshot, compress="zstd"))
        assert follower.snapshot().keys() == snapshot.keys()
        from rlfarm.core import codec

        assert codec.pack(follower.snapshot()) == codec.pack(snapshot)  # the same state, every byte
    assert ends >= 4 and after_end and fresh_restores == 3


def test_a_snapshot_taken_right_before_a_life_is_lost_or_a_game_ends_restores_what_follows(short_games):
    """Breakout with terminal_on_life_loss and episodes cut short: restored from the state one step
    before a life is lost or an episode ends, a fresh AleVector flags the life as the original does,
    ends the episode alike (its final observation from the max-pool buffers as the early break left
    them) and resets alike (no-op starts drawn from the restored generator)."""
    from rlfarm.envs.ale_vector import AleVector

    env_id = short_games["ALE/Breakout-v5"]
    options = {"noop_max": 30, "terminal_on_life_loss": True}
    original = AleVector(env_id, 2, options)
    original.reset(seed=[21, 22])
    rng = np.random.default_rng(4)
    checked = {"life lost": 0, "episode ended": 0}
    for t in range(1500):
        before = _through_codec(original.snapshot())
        actions = rng.integers(0, 4, 2)
        result = original.step(actions)
        ended, lost = (result[2] | result[3]).any(), result[4]["life_lost"].any()
        event = "episode ended" if ended else "life lost" if lost else None
        if event is None or checked[event] == 2:
            continue
        restored = AleVector(env_id, 2, options)
        restored.restore(before)
        _same_step(result, restored.step(actions), t)
        for k in range(30):  # what follows: the game, or the new episode's first steps
            actions = rng.integers(0, 4, 2)
            _same_step(original.step(actions), restored.step(actions), t + 1 + k)
        checked[event] += 1
        if min(checked.values()) == 2:
            break
    assert checked == {"life lost": 2, "episode ended": 2}


def test_restore_refuses_a_snapshot_of_another_game_size_or_preprocessing():
    from rlfarm.envs.ale_vector import AleVector

    pong = AleVector("ALE/Pong-v5", 2, {"noop_max": 30})
    pong.reset(seed=1)
    pong.step(np.zeros(2, np.int64))
    snapshot = _through_codec(pong.snapshot())
    for env_id, num_envs, options, says in (
        ("ALE/Breakout-v5", 2, {"noop_max": 30}, "game"),
        ("ALE/Pong-v5", 3, {"noop_max": 30}, "num_envs"),
        ("ALE/Pong-v5", 2, {"noop_max": 30, "frame_stack": 3}, "frame_stack"),
        ("PongNoFrameskip-v4", 2, {"noop_max": 30}, "repeat_action_probability"),
    ):
        with pytest.raises(ValueError, match=says):
            AleVector(env_id, num_envs, options).restore(snapshot)

    other = AleVector("ALE/Pong-v5", 2, {"noop_max": 30})
    broken = dict(snapshot, ale_states=snapshot["ale_states"][:-1])
    with pytest.raises(ValueError, match="ale_states"):
        other.restore(broken)
    sizes = snapshot["ale_state_sizes"]
    corrupt = snapshot["ale_states"].copy()
    corrupt[24:28] = 0  # the emulator state's length: the framing no longer adds up
    with pytest.raises(ValueError, match="lengths do not add up"):
        other.restore(dict(snapshot, ale_states=corrupt))
    no_rng = b"".join(ale.cloneState(include_rng=False).serialize() for ale in pong._ales)
    with pytest.raises(ValueError, match="without its generator"):
        other.restore(
            dict(
                snapshot,
                ale_states=np.frombuffer(no_rng, np.uint8),
                ale_state_sizes=np.array([len(no_rng) // 2] * 2, np.int64),
            )
        )
    assert sizes.sum() == snapshot["ale_states"].size
    with pytest.raises(ValueError, match="PCG64"):
        other.restore(dict(snapshot, np_random=[{"bit_generator": "PCG64", "state": "x"}] * 2))
    with pytest.raises(ValueError, match="not an AleVector snapshot"):
        other.restore({"format": "something else"})
    other.restore(snapshot)  # the failed attempts changed nothing that stops a good one
    actions = np.array([2, 3])
    _same_step(pong.step(actions), other.step(actions), 0)

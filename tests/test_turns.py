"""Turn-based games (rlfarm.envs.turns), action masks in acting, scripted opponents and self-play's
league (rlfarm.core.league): unit tests on PettingZoo's connect_four_v3, and one run through a farm."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util

import numpy as np
import pytest
import redis

from rlfarm.config import RunConfig
from rlfarm.core.league import SELF, League, outcomes
from rlfarm.core.rollout import collect, run_episodes
from rlfarm.envs import make_env, make_vector_env, space_spec
from rlfarm.envs.opponents import connect_four_lookahead, random_legal, scripted
from rlfarm.envs.turns import TurnVector
from rlfarm.nn.acting import masked_sample

HAS_CLASSIC = importlib.util.find_spec("pettingzoo") is not None
NO_CLASSIC = 'needs pettingzoo (the multiagent extra: pip install -e ".[multiagent]")'
C4 = "pettingzoo/classic/connect_four_v3"
needs_classic = pytest.mark.skipif(not HAS_CLASSIC, reason=NO_CLASSIC)


def _column_player(column: int):
    """Always the given column while it is legal, else the first legal one."""

    def play(obs, mask, rng):
        return np.where(mask[:, column], column, mask.argmax(-1))

    return play


def _ppo_actor(spec, hidden=(32,)):
    from rlfarm.algos.ppo.policies import ActorCritic

    policy = dataclasses.replace(RunConfig().policy, hidden_sizes=hidden)
    return ActorCritic(spec, policy).actor_snapshot()


# ---- the vector of games -------------------------------------------------------------------------
@needs_classic
def test_a_turn_based_game_is_one_sub_env_per_game_with_its_legal_moves():
    envs = make_vector_env(C4, 4)
    assert isinstance(envs, TurnVector) and envs.num_envs == 4
    spec = space_spec(envs)
    assert (spec.obs_shape, spec.action_dim, spec.action_mask, spec.seats) == ((84,), 7, True, 2)
    obs, info = envs.reset(seed=[10, 11, 12, 13])
    assert obs.shape == (4, 6, 7, 2) and info["action_mask"].shape == (4, 7)
    # Seeds 10 and 12 put the learner first (an empty board), 11 and 13 second (one opponent piece).
    assert obs[[0, 2]].sum() == 0 and (obs[[1, 3]].sum(axis=(1, 2, 3)) == 1).all()
    assert obs[1, ..., 1].sum() == 1 and obs[1, ..., 0].sum() == 0  # plane 1: the opponent's piece


@needs_classic
def test_the_learner_gets_its_win_at_its_move_and_its_loss_at_its_last_move():
    """First seat: four in column 0 win at the learner's 4th move (+1). Second seat: the opponent's
    four in column 1 end the game on the opponent's move, and the learner's 3rd step gets the -1."""
    envs = make_vector_env(C4, 2)
    envs.set_opponents(["col1", "col1"], {"col1": _column_player(1)})
    envs.reset(seed=[0, 1])  # game 0: learner first; game 1: learner second
    rewards, ends = [], []
    for _ in range(4):
        _, reward, terminated, truncated, info = envs.step(np.array([0, 0]))
        rewards.append(reward.copy())
        ends.append(terminated.copy())
    rewards, ends = np.array(rewards), np.array(ends)
    assert rewards[:, 0].tolist() == [0, 0, 0, 1] and ends[:, 0].tolist() == [False, False, False, True]
    assert rewards[:, 1].tolist()[:3] == [0, 0, -1] and ends[:3, 1].tolist() == [False, False, True]
    assert [r for _, r in envs.finished][:2] == [-1.0, 1.0]  # (game 1 ended first)


@needs_classic
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_an_illegal_move_is_never_taken_over_many_steps(algo):
    """Actors sample (PPO) or explore (DQN, epsilon 1 and 0.5) among the legal moves only; checked
    against the masks the env gave at every step, full columns included, and by the games' scores:
    PettingZoo's connect four ends a game on an illegal move with -1 for its player."""
    envs = make_vector_env(C4, 16)
    spec = space_spec(envs)
    if algo == "ppo":
        actor = _ppo_actor(spec)
    else:
        from rlfarm.algos.dqn.policies import QNetwork

        actor = QNetwork(spec, dataclasses.replace(RunConfig().policy, hidden_sizes=(32,))).actor_snapshot()
    envs.set_opponents(["random"] * 16, {"random": random_legal})
    full_columns = 0
    for seed, epsilon in ((1, 1.0), (2, 0.5)):
        acting = actor.with_options(epsilon=epsilon) if algo == "dqn" else actor
        rollout = collect(acting, envs, 400, list(range(seed * 100, seed * 100 + 16)), seed)
        t, n = np.indices(rollout.actions.shape)
        assert rollout.action_masks[t, n, rollout.actions].all()
        full_columns += int((~rollout.action_masks).sum())
        # Random players lose about as often as they win: no run of -1s from illegal moves.
        assert len(rollout.episode_returns) > 100
    assert full_columns > 1000  # the masks did forbid moves, often


def test_masked_sampling_never_picks_an_illegal_action_and_follows_the_legal_probabilities():
    rng = np.random.default_rng(0)
    probs = np.tile(np.array([0.0, 0.5, 0.0, 0.25, 0.25, 0.0]), (200_000, 1))
    mask = probs > 0
    actions = masked_sample(probs, mask, rng)
    assert mask[np.arange(len(actions)), actions].all()
    freq = np.bincount(actions, minlength=6) / len(actions)
    assert np.allclose(freq, probs[0], atol=0.005)

    # u = 0 on a first action that is illegal, and rounding past the last legal one: still legal.
    class Edge:
        def __init__(self, u):
            self.u = u

        def random(self, shape):
            return np.full(shape, self.u)

    for u in (0.0, 1.0):
        picked = masked_sample(probs[:1], mask[:1], Edge(u))
        assert mask[0, picked[0]], (u, picked)


@needs_classic
def test_the_lookahead_player_wins_when_it_can_and_blocks_when_it_must():
    board = np.zeros((6, 7, 2), np.int8)
    board[5, 0:3, 0] = 1  # its own three in the bottom row: column 3 wins
    board[5, 4:6, 1] = 1
    board[4, 4, 1] = 1
    mask = np.ones((1, 7), bool)
    rng = np.random.default_rng(0)
    assert connect_four_lookahead(board[None], mask, rng)[0] == 3
    block = np.zeros((6, 7, 2), np.int8)
    block[5, 0, 0] = block[4, 0, 0] = 1
    block[3:6, 6, 1] = 1  # the other's three in column 6: block it
    assert connect_four_lookahead(block[None], mask, rng)[0] == 6
    # Against random legal moves, lookahead wins nearly every game (as first and second player).
    envs = make_vector_env(C4, 8)
    envs.set_opponents(["random"] * 8, {"random": random_legal})
    obs, info = envs.reset(seed=list(range(8)))
    while len(envs.finished) < 200:
        obs, _, _, _, info = envs.step(connect_four_lookahead(obs, info["action_mask"], rng))
    assert np.mean([r > 0 for _, r in envs.finished]) > 0.85


@needs_classic
def test_an_evaluation_plays_whole_games_alternating_seats_against_the_chosen_player():
    env = make_env(C4)
    spec = space_spec(env)
    env.set_opponents(["lookahead"], {"lookahead": scripted("lookahead", C4)})
    returns = run_episodes(_ppo_actor(spec), env, 20, seed=5)
    assert set(returns) <= {-1.0, 0.0, 1.0} and returns.mean() < -0.5  # an untrained policy loses
    assert env.finished == [("lookahead", returns[-1])]  # (each episode's reset starts the list anew)


def test_scripted_players_are_checked_by_name_and_game():
    from rlfarm.errors import EnvError

    with pytest.raises(EnvError, match="plays connect four only"):
        scripted("lookahead", "pettingzoo/classic/tictactoe_v3")
    with pytest.raises(EnvError, match="unknown opponent 'best'"):
        scripted("best", C4)


# ---- the league ------------------------------------------------------------------------------------
def test_the_league_keeps_every_kth_version_and_draws_the_same_opponents_for_the_same_task():
    league = League(size=3, every=2, latest_share=0.5)
    assert league.draw(4, (1, 0, 0)) == [SELF] * 4  # nothing to play against yet: mirror matches
    left = []
    for version in range(11):
        left += league.published(version)
    assert league.members == [6, 8, 10] and left == [0, 2, 4]
    draw = league.draw(1000, (1, 7, 3))
    assert draw == league.draw(1000, (1, 7, 3)) and draw != league.draw(1000, (1, 7, 4))
    share = np.mean([d == SELF for d in draw])
    assert 0.45 < share < 0.55 and {d for d in draw if d != SELF} == {"v6", "v8", "v10"}
    scripted_league = League(scripted="lookahead")
    assert scripted_league.draw(3, (1, 0, 0)) == ["lookahead"] * 3 and scripted_league.published(5) == []


def test_elo_rises_with_wins_the_anchor_stays_and_mirror_matches_rate_nothing():
    league = League(every=1)
    league.published(0)
    league.published(1)
    league.record(1, {"random": [10, 0, 0], "v0": [6, 2, 2], SELF: [5, 0, 5]})
    assert league.ratings["random"] == 0.0
    assert league.rating(1) > league.rating(0) and league.rating(1) > 0
    assert league.win_rate() == pytest.approx((16 + 1) / 20) and league.win_rate(["random"]) == 1.0
    league.published(2)
    assert league.rating(2) == league.rating(1)  # a new version starts where its predecessor stands
    restored = League()
    restored.restore(league.to_dict())
    assert restored.to_dict() == league.to_dict()
    assert outcomes([("v0", 1.0), ("v0", -1.0), (SELF, 0.0)]) == {"v0": [1, 0, 1], SELF: [0, 1, 0]}


# ---- through the farm ------------------------------------------------------------------------------
@pytest.mark.farm
@needs_classic
def test_self_play_trains_through_the_farm_with_its_league_pinned_and_rated(farm, tmp_path):
    """SYNC PPO on connect four: tasks name their games' opponents, workers fetch the league's versions,
    results report the games, the trainer pins the league in Redis and logs its ratings."""
    from .conftest import read_summary, run_cli, train_on

    run_id = "c4-league"
    sets = {
        "env.num_envs": 8,
        "farm.steps_per_env": 64,
        "selfplay.league_every": 2,
        "selfplay.league_size": 2,
        "farm.keep_versions": 2,
        "eval.interval": 0,
        "eval.episodes": 4,
        "selfplay.eval_opponent": "lookahead",
    }
    options = [part for key, value in sets.items() for part in ("--set", f"{key}={value}")]
    result = train_on(farm, tmp_path, run_id, "--preset", "connect-four-ppo", "--total-steps", "6144", *options)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(tmp_path / run_id)
    assert summary["env_steps"] == 6144 and summary["final_version"] == 6
    with open(tmp_path / run_id / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["selfplay/league_size"]) == 2
    assert rows[-1]["selfplay/elo"] != "" and 0.0 <= float(rows[-1]["selfplay/win_rate"]) <= 1.0
    client = redis.Redis.from_url(farm.redis_url)
    pinned = {int(v) for v in client.smembers(f"rlfarm:{run_id}:pinned")}
    # The league (v4, v6) stays pinned while v4 is older than the 2 versions kept; v2 left it, unpinned.
    assert {4, 6} <= pinned and 2 not in pinned, pinned
    # `rlfarm eval` plays the run's policy against the player asked for, and says its record.
    played = run_cli("eval", str(tmp_path / run_id), "--episodes", "4", "--opponent", "lookahead")
    assert played.returncode == 0 and "against lookahead: " in played.stdout, played.stderr
    unknown = run_cli("eval", str(tmp_path / run_id), "--opponent", "best")
    assert unknown.returncode == 2 and "unknown opponent 'best'" in unknown.stderr


@pytest.mark.farm
@needs_classic
def test_games_longer_than_a_task_go_on_in_the_next_task_and_are_reported_whole(farm, tmp_path):
    """farm.episodes = "continue" with tasks of 2 of the learner's moves: a game takes at least 3 of
    them, so "fresh" tasks would end none. Each game's board, turn, seat and the opponents' generator
    go with its stream, so games end in later tasks, whole, and count for the league."""
    from .conftest import read_csv, train_on

    run_id = "c4-continue"
    sets = {
        "env.num_envs": 4,
        "farm.steps_per_env": 2,
        "farm.episodes": "continue",
        "selfplay.league_every": 1,
        "selfplay.league_size": 2,
        "policy.hidden_sizes": "[32]",
        "eval.interval": 0,
        "target_return": "inf",
    }
    options = [part for key, value in sets.items() for part in ("--set", f"{key}={value}")]
    result = train_on(farm, tmp_path, run_id, "--preset", "connect-four-ppo", "--total-steps", "320", *options)
    assert result.returncode == 0, result.stderr[-3000:]
    lengths = [int(e["episodic_length"]) for e in read_csv(tmp_path / run_id / "episodes.csv")]
    # 3 to 21 moves of the learner's: every game whole, none cut at a task's end
    assert lengths and min(lengths) >= 3 and max(lengths) <= 21, lengths
    # 320 moves in 8 streams (2 tasks x 4 games), each leaving at most one game of <= 20 moves unfinished
    assert 320 - 8 * 20 <= sum(lengths) <= 320
    with open(tmp_path / run_id / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows[-1]["selfplay/elo"] != "" and 0.0 <= float(rows[-1]["selfplay/win_rate"]) <= 1.0


@pytest.mark.farm
def test_a_resumed_league_keeps_the_members_its_redis_holds_and_drops_the_others(redis_only):
    """A run resumed on a Redis that lost its versions (or on another one): members tasks could not
    fetch leave the league, the others are pinned again (held by the league, not the evaluations)."""
    import torch

    from rlfarm.farm.connection import connect
    from rlfarm.farm.policies.store import PolicyStore
    from rlfarm.trainer.selfplay import SelfPlay

    store = PolicyStore(connect(redis_only.redis_url), "league-resume", keep=2)
    for version in range(12):
        store.publish(version, {"w": torch.full((2,), float(version))}, "ppo")
    selfplay = SelfPlay(RunConfig(), store)
    selfplay.restore({"league": {"members": [5, 10, 11], "ratings": {"random": 0.0}, "games": {}}, "newest": 11})
    assert selfplay.pin_league() == [5]  # trimmed long ago (keep = 2): gone from this Redis
    assert selfplay.league.members == [10, 11] and set(store.pinned) == {10, 11}
    store.unpin(10)  # an evaluation's unpin does not release the league's hold
    assert 10 in store.pinned


@pytest.mark.process
@needs_classic
def test_a_scripted_opponent_the_game_lacks_is_refused_before_the_run_starts(tmp_path):
    """`selfplay.opponents=lookahead` on tic-tac-toe failed on the worker after the run's directory
    and keys were made; now one line before anything starts."""
    from .conftest import run_cli

    result = run_cli(
        "train",
        "--logdir",
        str(tmp_path),
        "--preset",
        "connect-four-ppo",
        "--env",
        "pettingzoo/classic/tictactoe_v3",
        "--set",
        "selfplay.opponents=lookahead",
    )
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "opponent 'lookahead' plays connect four only" in lines[0], result.stderr
    assert not any(tmp_path.iterdir())

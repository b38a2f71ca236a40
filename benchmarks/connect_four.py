"""A connect-four policy's record against scripted players, as first and as second player, greedy.

    python benchmarks/connect_four.py runs/c4/best_policy.safetensors
    python benchmarks/connect_four.py FILE --games 500 --opponents random lookahead

Each line: wins, draws and losses of `--games` games with the policy moving first and as many
moving second, and whether any move it chose was illegal (it never may: its actor picks among the
legal moves the env's mask allows; PettingZoo's env would end such a game with a loss).
"""

from __future__ import annotations

import argparse

import numpy as np


def play(actor, opponent: str, games: int, first: bool, seed: int) -> tuple[int, int, int, int]:
    from rlfarm.envs import make_vector_env
    from rlfarm.envs.opponents import scripted

    env_id = "pettingzoo/classic/connect_four_v3"
    envs = make_vector_env(env_id, 16)
    envs.set_opponents([opponent] * 16, {opponent: scripted(opponent, env_id)})
    # A game's first seat after a reset seeded s is s mod 2 (rlfarm.envs.turns); each game then
    # alternates, so keep only the games played from the asked seat.
    offset = 0 if first else 1
    obs, info = envs.reset(seed=[seed + 2 * g + offset for g in range(16)])
    rng = np.random.default_rng(seed)
    record, illegal = [], 0
    while len(record) < games:
        mask = info["action_mask"]
        seats = envs._seat.copy()
        action, _, _ = actor.act(obs.reshape(16, -1).astype(np.float32), rng, True, mask=mask)
        illegal += int((~mask[np.arange(16), action]).sum())
        obs, reward, terminated, truncated, info = envs.step(action)
        for g in np.flatnonzero(terminated | truncated):
            if (seats[g] == 0) == first:
                record.append(reward[g])
    record = np.asarray(record[:games])
    return int((record > 0).sum()), int((record == 0).sum()), int((record < 0).sum()), illegal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy", help="a policy file (best_policy.safetensors, final_policy.safetensors)")
    parser.add_argument("--games", type=int, default=500, help="games per opponent and seat")
    parser.add_argument("--opponents", nargs="+", default=["random", "lookahead"])
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args()

    from rlfarm.evaluation import playback

    policy = playback.from_file(args.policy)
    env, env_id = playback.open_env(policy)
    actor = playback.actor_for(policy, env, env_id)
    print(f"{args.policy} (policy v{policy.version}), {args.games} greedy games per opponent and seat")
    for opponent in args.opponents:
        for first in (True, False):
            wins, draws, losses, illegal = play(actor, opponent, args.games, first, args.seed)
            seat = "first " if first else "second"
            print(
                f"  vs {opponent:9s} moving {seat}: won {wins / args.games:6.1%}  drawn {draws / args.games:5.1%}  "
                f"lost {losses / args.games:6.1%}  illegal moves {illegal}"
            )


if __name__ == "__main__":
    main()

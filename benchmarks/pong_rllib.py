"""The reference implementation itself: RLlib's APPO (old API stack, ray 2.9.3) on Pong, as its
`rllib/tuned_examples/appo/pong-appo.yaml` runs it, sized for this machine. `pong-appo` follows this
recipe point by point (tests/test_appo_reference.py); this script gives its curve on the same cores.

ray 2.9.3's old stack needs gymnasium 0.28, so it lives in a virtual environment of its own:

    python3.11 -m venv /tmp/rllib-ref && /tmp/rllib-ref/bin/pip install "torch==2.13.0" \\
        "ray[rllib]==2.9.3" "gymnasium==0.28.1" "ale-py==0.9.0" "numpy==1.26.4" "pyarrow<17" \\
        "pandas<2.3" "setuptools<70"
    /tmp/rllib-ref/bin/python benchmarks/pong_rllib.py --workers 1 --minutes 80 --out runs/rllib-seed1.csv

(numpy 2, pyarrow 17+ and a setuptools without pkg_resources break ray 2.9.3; ale-py 0.9 ships the
ROMs and runs with gymnasium 0.28.) The YAML's settings, with what differs on a machine without a
GPU: `num_gpus` 0 and `--workers` rollout workers (the YAML: 32) of 8 envs, fragments of 50 steps,
train batches of 750, each learned twice (num_sgd_iter 2; ray 2.9.3 sets minibatch_buffer_size to the
tower stacks', 1, and says so), V-trace, clip 0.3, vf_loss_coeff 1, grad_clip 10, 42x42 frames.
`max_sample_requests_in_flight_per_worker` is a dead key in 2.9.3: the live one,
`max_requests_in_flight_per_sampler_worker`, keeps its default 2 (`--inflight`).

Writes a row per training iteration to --out (env steps, seconds, RLlib's episode_reward_mean, a mean
of the last 100 games, and the entropy) and a row per game to OUT-games.csv (global_step, wall_time,
episodic_return, as rlfarm's episodes.csv), which `benchmarks/pong.py`'s crossings read alike.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import signal
import sys
import tempfile
import time

ENV_ID = "ALE/Pong-v5"


def make_pong(env_config):
    """RLlib's own env creation (gym.make of the id), after importing ale_py: with gymnasium 0.28 the
    ALE/ ids exist only once ale_py is imported, which RLlib's rollout workers never do. The id keeps
    RLlib's Atari check true, so its DeepMind wrappers (42x42, frame skip 4, stack 4) apply."""
    import ale_py  # noqa: F401
    import gymnasium as gym

    return gym.make(ENV_ID, **dict(env_config))


def value(result: dict, *keys, default=None):
    for key in keys:
        if not isinstance(result, dict) or key not in result:
            return default
        result = result[key]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1, help="rollout workers (the YAML: 32)")
    parser.add_argument("--steps", type=int, default=5_000_000, help="env steps budget (the YAML's stop: 5M)")
    parser.add_argument("--minutes", type=float, default=0.0, help="wall-time budget (0: none)")
    parser.add_argument("--target", type=float, default=18.0, help="stop at this episode_reward_mean (the YAML's)")
    parser.add_argument("--out", default="runs/rllib-pong.csv", help="CSV of the iterations (and OUT-games.csv)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="ray.init(num_cpus=...)")
    parser.add_argument("--torch-threads", type=int, default=1, help="the learner's torch threads")
    parser.add_argument("--inflight", type=int, default=2, help="max_requests_in_flight_per_sampler_worker")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    def stop(signum, frame):  # SIGTERM and SIGHUP end the loop, so ray is shut down
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)

    import ray
    import torch
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.tune.logger import UnifiedLogger
    from ray.tune.registry import register_env

    register_env(ENV_ID, make_pong)
    torch.set_num_threads(args.torch_threads)
    driver_cpus = 1.0
    per_worker = min(1.0, max(args.cpus - driver_cpus, 0.0) / max(1, args.workers))
    config = (
        APPOConfig()
        .experimental(_enable_new_api_stack=False)
        .framework("torch")
        .environment(ENV_ID, env_config={"frameskip": 1, "full_action_space": False, "repeat_action_probability": 0.0})
        .rollouts(num_rollout_workers=args.workers, num_envs_per_worker=8, rollout_fragment_length=50)
        .training(
            vtrace=True,
            use_kl_loss=False,
            train_batch_size=750,
            broadcast_interval=1,
            max_requests_in_flight_per_sampler_worker=args.inflight,
            num_multi_gpu_tower_stacks=1,
            minibatch_buffer_size=4,
            num_sgd_iter=2,
            vf_loss_coeff=1.0,
            clip_param=0.3,
            grad_clip=10,
            model={"dim": 42},
        )
        .resources(num_gpus=0, num_cpus_for_local_worker=driver_cpus, num_cpus_per_worker=per_worker)
        .debugging(seed=args.seed, log_level="WARN")
    )
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    games_path = out.removesuffix(".csv") + "-games.csv"
    logdir = tempfile.mkdtemp(prefix="rllib-pong-")
    # A private local cluster on the loopback address only (ray would take the host's first address).
    ray.init(address="local", num_cpus=args.cpus, num_gpus=0, include_dashboard=False, _node_ip_address="127.0.0.1")
    algo = None
    try:
        algo = config.build(logger_creator=lambda cfg: UnifiedLogger(cfg, logdir, loggers=None))
        with open(out, "w", newline="") as f, open(games_path, "w", newline="") as g:
            rows, games = csv.writer(f), csv.writer(g)
            rows.writerow(["iteration", "env_steps", "wall_seconds", "episode_reward_mean_100", "entropy"])
            games.writerow(["global_step", "wall_time", "episodic_return"])
            start, iteration = time.time(), 0
            while True:
                result = algo.train()
                iteration += 1
                seconds = time.time() - start
                steps = result.get("num_env_steps_sampled", 0)
                mean = result.get("episode_reward_mean", float("nan"))
                entropy = value(result, "info", "learner", "default_policy", "learner_stats", "entropy")
                rows.writerow([iteration, steps, round(seconds, 2), mean, entropy])
                ended = result.get("episodes_this_iter", 0) or 0
                scores = (value(result, "hist_stats", "episode_reward") or [])[-ended:] if ended else []
                games.writerows((steps, round(seconds, 2), float(score)) for score in scores)
                f.flush(), g.flush()
                print(f"{steps} env steps, {seconds:.0f} s: mean of 100 games {mean}, entropy {entropy}", flush=True)
                if steps >= args.steps or (args.minutes and seconds >= args.minutes * 60):
                    break
                if not math.isnan(mean) and mean >= args.target:
                    break
    finally:
        if algo is not None:
            algo.stop()
        ray.shutdown()
    print(f"curves: {out}, {games_path}", file=sys.stderr)


if __name__ == "__main__":
    main()

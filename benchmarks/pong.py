"""Pong on this machine's cores: rlfarm's training throughput against one Stable-Baselines3 PPO process,
and how much of the machine's attainable FLOP rate the learner and the actors use. One run, one machine.

    pip install -e ".[atari,bench]"
    python benchmarks/pong.py                    # 240 s of each side, after a 30 s warm-up
    python benchmarks/pong.py --seconds 120 --skip-sb3
    python benchmarks/pong.py --preset pong --preset pong-appo   # each preset against one SB3 run
    python benchmarks/pong.py --to-score 18 --preset pong-appo --minutes 90 --out runs/to-score

With `--to-score T` the figure is wall time to a score instead: each preset (`rlfarm train --preset P
--seed S`, the embedded default) and then SB3 PPO with the zoo's Atari settings train on this machine,
one after the other, until the mean of their last 20 games reaches T or `--minutes` run out; the
minutes and env steps at which each crossed -15, 0, +10 and T are printed side by side, and the
curves kept under `--out` (rlfarm's run directory; SB3's sb3-seedS.csv, one row per game).

1. Attainable FLOP rate: a 2048x2048 float32 matmul on 1 thread and on all cores (median of rounds).
2. In isolation: one learner update of the `pong` preset as shipped (synthetic batch of its shape, the
   threads the trainer takes on this machine) and one acting step of a task's batch (the worker's actor, one thread), in
   GFLOP/s and as a fraction of that rate. FLOPs are counted from the network's layers: forward
   2 x multiply-adds; backward twice the forward, less the first layer's input gradient, which
   nothing needs.
3. Training: `rlfarm train --preset pong` (embedded default, the preset as shipped) for `--seconds`,
   then SB3 PPO with rl-baselines3-zoo's Atari settings (8 envs x 128 steps, 4 epochs of minibatch
   256, lr and clip 2.5e-4 and 0.1 annealed, ent 0.01, vf 0.5; AtariWrapper with frame stack 4),
   one process, DummyVecEnv, torch on all cores, for the same seconds. Env steps/s of each are taken
   after `--warmup` seconds of its own (start-up, imports, first versions excluded), and their ratio
   printed, with the FLOP rates the learner (env steps learned x FLOPs per step learned) and the
   actors (env steps acted x forward FLOPs) delivered as a fraction of the whole machine's.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def matmul_gflops(threads: int, size: int = 2048, rounds: int = 7) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(2):
        a @ b
    rates = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(3):
            a @ b
        rates.append(3 * 2 * size**3 / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def layer_flops(network, example) -> tuple[float, float]:
    """(forward FLOPs per observation, the first layer's share) from the Conv2d and Linear layers."""
    import torch
    from torch import nn

    counted: list[float] = []

    def hook(module, inputs, output):
        if isinstance(module, nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1] * module.in_channels // module.groups
            counted.append(2.0 * output[0].numel() * k)
        else:
            counted.append(2.0 * module.in_features * module.out_features)

    handles = [m.register_forward_hook(hook) for m in network.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        network.evaluate(example, torch.zeros(1, dtype=torch.long))
    for h in handles:
        h.remove()
    return sum(counted), counted[0]


def pong_setup(preset: str = "pong"):
    import torch

    from rlfarm import config as C
    from rlfarm.envs import describe

    cfg = C.build(preset, [])
    spec = describe(cfg.env.id, C.to_dict(cfg)["env"])
    from rlfarm.algos.ppo.policies import ActorCritic

    net = ActorCritic(spec, cfg.policy)
    fwd, first = layer_flops(net, torch.zeros((1, *spec.obs_shape), dtype=torch.uint8))
    return cfg, spec, fwd, first


def learner_update_seconds(cfg, spec, threads: int, updates: int = 8) -> float:
    """Seconds the learner takes per update's worth of results (SYNC: a group; APPO: results_per_update
    results, whatever its circular buffer makes of them), after as many for warm-up."""
    import torch
    from learner import synthetic_rollout

    from rlfarm.algos import learner

    torch.set_num_threads(threads)
    algorithm = learner(cfg.algo, cfg.mode)(cfg, spec, torch.device("cpu"))
    rng = np.random.default_rng(0)
    if cfg.mode == "sync":  # the trainer hands SYNC PPO its whole group as one rollout
        rollouts = [synthetic_rollout(spec, cfg.farm.steps_per_env, cfg.env.num_envs * cfg.farm.num_tasks, rng)]
    else:  # APPO takes results_per_update results per update
        results = max(1, cfg.async_.results_per_update or 1)
        rollouts = [synthetic_rollout(spec, cfg.farm.steps_per_env, cfg.env.num_envs, rng) for _ in range(results)]
    spent = 0.0
    for i in range(2 * updates):  # (APPO's buffer of B batches learns in bursts: 2 x 8 rounds cover them)
        for r in rollouts:
            algorithm.observe(r, 0)
        t = time.perf_counter()
        while algorithm.ready():
            algorithm.update(0.0)
        if i >= updates:  # the first half is a warm-up
            spent += time.perf_counter() - t
    return spent / updates


def actor_step_seconds(cfg, spec, num_envs: int, steps: int = 200) -> tuple[float, str]:
    import torch

    from rlfarm.algos.ppo.policies import ActorCritic

    torch.set_num_threads(1)  # as on a worker
    actor = ActorCritic(spec, cfg.policy).actor_snapshot()
    obs = np.random.default_rng(0).integers(0, 256, (num_envs, *spec.obs_shape), dtype=np.uint8)
    rng = np.random.default_rng(0)
    for _ in range(10):
        actor.act(obs, rng)
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(steps // 5):
            actor.act(obs, rng)
        rounds.append((time.perf_counter() - t) / (steps // 5))
    return statistics.median(rounds), type(actor).__name__


def rlfarm_sps(preset: str, seconds: float, warmup: float, extra: list[str]) -> tuple[float, dict]:
    """Env steps/s of `rlfarm train --preset PRESET` over `seconds` after `warmup` seconds of its loop."""
    with tempfile.TemporaryDirectory() as logdir:
        cmd = [
            sys.executable,
            "-m",
            "cli",
            "train",
            "--preset",
            preset,
            "--total-steps",
            str(10**9),
            "--target-return",
            "100",  # (never reached: the run is measured, not stopped)
            "--logdir",
            logdir,
            "--run-id",
            "bench",
            *extra,
        ]
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        progress = Path(logdir) / "bench" / "progress.csv"
        try:
            deadline = time.monotonic() + 600
            rows: list[dict] = []
            while time.monotonic() < deadline:  # until the loop has run warmup + seconds
                if proc.poll() is not None:
                    raise RuntimeError(f"rlfarm train exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
                if progress.exists():
                    rows = [r for r in csv.DictReader(progress.open()) if r.get("wall_time")]
                    measured = [r for r in rows if float(r["wall_time"]) >= warmup]
                    # two rows in the window at least: a SYNC iteration on a busy machine can outlast it
                    if len(measured) >= 2 and float(rows[-1]["wall_time"]) >= warmup + seconds:
                        break
                time.sleep(1.0)  # polling a file another process appends to
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)  # a clean stop: workers and Redis go with it
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        window = [r for r in rows if float(r["wall_time"]) >= warmup]
        first, last = window[0], window[-1]
        sps = (float(last["global_step"]) - float(first["global_step"])) / (
            float(last["wall_time"]) - float(first["wall_time"])
        )
        return sps, {**last, **farm_means(window)}


FARM_KEYS = ("farm/policy_lag", "farm/policy_lag_end", "farm/learner_busy", "farm/slots_waiting", "farm/window")


def farm_means(rows: list[dict]) -> dict[str, float]:
    """ASYNC's farm figures (policy lag, tasks in flight, who waits) as means over progress.csv rows,
    and the largest lag: one log interval's figures swing with the update that fell into it."""
    means: dict[str, float] = {}
    for key in FARM_KEYS:
        values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
        if values:
            means[key] = sum(values) / len(values)
    lag_max = [float(r["farm/policy_lag_max"]) for r in rows if r.get("farm/policy_lag_max") not in (None, "")]
    if lag_max:
        means["farm/policy_lag_max"] = max(lag_max)
    return means


def learner_busy(row: dict) -> float:
    """The fraction of the wall time the learner computed: ASYNC logs it (farm/learner_busy); a SYNC
    iteration is its collect, then its update."""
    if row.get("farm/learner_busy"):
        return float(row["farm/learner_busy"])
    update, collect = float(row.get("farm/update_seconds") or 0), float(row.get("farm/collect_seconds") or 0)
    return update / (update + collect) if update + collect > 0 else float("nan")


def zoo_ppo(env, learning_rate, clip_range, seed: int, device: str):
    """SB3 PPO with rl-baselines3-zoo's Atari settings on `env` (8 envs x 128 steps, 4 epochs of 256,
    ent 0.01, vf 0.5; the schedules given)."""
    from stable_baselines3 import PPO

    return PPO(
        "CnnPolicy",
        env,
        n_steps=128,
        n_epochs=4,
        batch_size=256,
        learning_rate=learning_rate,
        clip_range=clip_range,
        vf_coef=0.5,
        ent_coef=0.01,
        verbose=0,
        seed=seed,
        device=device,
    )


def sb3_sps(seconds: float, warmup: float, n_envs: int = 8, subproc: bool = False, device: str = "cpu") -> float:
    """Env steps/s of SB3 PPO (zoo Atari settings) over `seconds` after `warmup` seconds of learning:
    `n_envs` envs in one process (DummyVecEnv) or one process each (`subproc`: SubprocVecEnv), the
    learner on `device`."""
    import ale_py
    import gymnasium as gym
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import SubprocVecEnv, VecFrameStack

    gym.register_envs(ale_py)
    torch.set_num_threads(os.cpu_count() or 1)
    # fork: the subprocesses inherit ale_py's registration of the ALE ids (forkserver and spawn do not).
    vec = {"vec_env_cls": SubprocVecEnv, "vec_env_kwargs": {"start_method": "fork"}} if subproc else {}
    env = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=n_envs, seed=0, **vec), n_stack=4)

    def linear(start: float):
        return lambda remaining: remaining * start

    marks: list[tuple[float, int]] = []

    class Clock(BaseCallback):
        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_rollout_end(self) -> None:
            marks.append((time.perf_counter() - self.start, self.num_timesteps))

        def _on_step(self) -> bool:
            return time.perf_counter() - self.start < warmup + seconds

    model = zoo_ppo(env, linear(2.5e-4), linear(0.1), seed=0, device=device)
    model.learn(total_timesteps=10**8, callback=Clock())
    window = [m for m in marks if m[0] >= warmup]
    if len(window) < 2:  # a run too short for two rollouts after the warm-up
        window = marks[-2:]
    (t0, s0), (t1, s1) = window[0], window[-1]
    return (s1 - s0) / (t1 - t0)


MARKS = (-15.0, 0.0, 10.0)  # the scores a to-score run reports crossing on its way to its target


def crossings(games: list[tuple[int, float, float]], targets: list[float]) -> dict[float, tuple[int, float] | None]:
    """(env steps, seconds) at which the mean of the last 20 games first reached each target, from
    (env steps, seconds, score) rows in the order the games ended; None where it never did."""
    found: dict[float, tuple[int, float] | None] = dict.fromkeys(targets)
    last20: list[float] = []
    for steps, seconds, score in games:
        last20 = (last20 + [score])[-20:]
        mean = sum(last20) / len(last20)
        for target in targets:
            if found[target] is None and len(last20) == 20 and mean >= target:
                found[target] = (steps, seconds)
    return found


def rlfarm_to_score(preset: str, seed: int, target: float, minutes: float, out: Path, extra: list[str]) -> list:
    """`rlfarm train --preset P --seed S` until its mean of 20 games reaches `target` (the run stops
    itself there) or `minutes` pass (then stopped with SIGINT, as Ctrl-C); its games as crossings() rows."""
    run_id = f"{preset}-seed{seed}"
    cmd = [sys.executable, "-m", "cli", "train", "--preset", preset, "--seed", str(seed)]
    cmd += ["--target-return", str(target), "--total-steps", str(10**9), "--logdir", str(out), "--run-id", run_id]
    proc = subprocess.Popen([*cmd, *extra], cwd=ROOT, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(minutes * 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # a clean stop: workers and Redis go with it
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    episodes = out / run_id / "episodes.csv"
    if not episodes.exists():
        raise RuntimeError(f"rlfarm train --preset {preset} wrote no {episodes} (exit {proc.returncode})")
    rows = csv.DictReader(episodes.open())
    return [(int(r["global_step"]), float(r["wall_time"]), float(r["episodic_return"])) for r in rows]


def sb3_to_score(seed: int, target: float, minutes: float, out: Path, device: str) -> list:
    """SB3 PPO (zoo Atari settings, 8 envs in one process, its schedules over the zoo's 10M env
    steps) until its mean of 20 games reaches `target` or `minutes` pass; its games, also written to
    OUT/sb3-seedS.csv."""
    import ale_py
    import gymnasium as gym
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    torch.set_num_threads(os.cpu_count() or 1)
    env = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=8, seed=seed), n_stack=4)
    zoo_steps = 10_000_000
    games: list[tuple[int, float, float]] = []

    class UntilScore(BaseCallback):
        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    games.append((self.num_timesteps, time.perf_counter() - self.start, float(info["episode"]["r"])))
            last20 = [g[2] for g in games[-20:]]
            reached = len(last20) == 20 and sum(last20) / 20 >= target
            return not reached and time.perf_counter() - self.start < minutes * 60

    model = zoo_ppo(env, lambda left: left * 2.5e-4, lambda left: left * 0.1, seed=seed, device=device)
    model.learn(total_timesteps=zoo_steps, callback=UntilScore())
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"sb3-seed{seed}.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["global_step", "wall_time", "episodic_return"])
        writer.writerows((steps, round(seconds, 3), score) for steps, seconds, score in games)
    return games


def to_score(args) -> None:
    """--to-score: each preset, then SB3, to the target or the budget; their crossings side by side."""
    out = Path(args.out)
    targets = [m for m in MARKS if m < args.to_score] + [args.to_score]
    extra = [f"--set={o}" for o in args.overrides] + ([f"--workers={args.workers}"] if args.workers else [])
    extra.append(f"--device={args.device}")
    sides: dict[str, list] = {}
    farm_lines = []
    for preset in args.presets or ["pong-appo"]:
        sides[f"rlfarm {preset}"] = rlfarm_to_score(preset, args.seed, args.to_score, args.minutes, out, extra)
        progress = out / f"{preset}-seed{args.seed}" / "progress.csv"
        if progress.exists():
            rows = list(csv.DictReader(progress.open()))
            m = dict.fromkeys([*FARM_KEYS, "farm/policy_lag_max"], float("nan"))
            m.update(farm_means(rows[len(rows) // 10 :]))  # past the first tenth: the run's start aside
            farm_lines.append(
                f"rlfarm {preset} {' '.join(extra)}: policy lag {m['farm/policy_lag']:.1f} "
                f"(max {m['farm/policy_lag_max']:.0f}), tasks in flight {m['farm/window']:.1f}, "
                f"learner busy {m['farm/learner_busy']:.2f}, slots waiting {m['farm/slots_waiting']:.2f}"
            )
    if not args.skip_sb3:
        sides["SB3 PPO (zoo)"] = sb3_to_score(args.seed, args.to_score, args.minutes, out, args.device)
    print(
        f"to a mean of 20 games >= {args.to_score:g} on {os.cpu_count()} cores, seed {args.seed}, at most "
        f"{args.minutes:g} min each; minutes (M env steps) at each crossing:"
    )
    print(f"{'':28}" + "".join(f"{t:>18g}" for t in targets) + f"{'env steps/s':>14}")
    for name, games in sides.items():
        found = crossings(games, targets)
        cells = "".join(
            f"{'-':>18}" if found[t] is None else f"{found[t][1] / 60:>9.1f} ({found[t][0] / 1e6:.2f}M)"
            for t in targets
        )
        rate = games[-1][0] / games[-1][1] if games and games[-1][1] > 0 else float("nan")
        last = [g[2] for g in games[-20:]]
        tail = (
            f"  (mean of the last {len(last)} games: {sum(last) / len(last):.1f} at {games[-1][0] / 1e6:.2f}M)"
            if last
            else ""
        )
        print(f"{name:28}{cells}{rate:>14.0f}{tail}")
    for line in farm_lines:
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--preset",
        dest="presets",
        action="append",
        default=[],
        help="rlfarm's preset (repeatable: each is measured; default pong)",
    )
    parser.add_argument("--seconds", type=float, default=240, help="measured seconds of each side's training")
    parser.add_argument("--warmup", type=float, default=30, help="seconds of each side's training not measured")
    parser.add_argument("--skip-sb3", action="store_true", help="rlfarm only")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for the rlfarm run (e.g. ppo.update_epochs=2)",
    )
    parser.add_argument("--workers", type=int, help="rlfarm's local worker processes (default: the preset's choice)")
    parser.add_argument("--device", default="cpu", help="both learners' device (rlfarm's trainer: --device)")
    parser.add_argument("--sb3-envs", type=int, default=8, help="SB3's envs (the zoo's: 8)")
    parser.add_argument("--sb3-subproc", action="store_true", help="SB3's envs in subprocesses (SubprocVecEnv)")
    parser.add_argument("--skip-alone", action="store_true", help="skip the learner and actor measured alone")
    parser.add_argument("--to-score", type=float, metavar="T", help="wall time to a mean of 20 games >= T instead")
    parser.add_argument("--minutes", type=float, default=90, help="--to-score: each side's budget of wall time")
    parser.add_argument("--seed", type=int, default=1, help="--to-score: the seed of each side's run")
    parser.add_argument("--out", default="runs/to-score", help="--to-score: where the runs' curves are kept")
    args = parser.parse_args()
    if args.to_score is not None:
        to_score(args)
        return
    cores = os.cpu_count() or 1

    peak1, peakn = matmul_gflops(1), matmul_gflops(cores)
    print(
        f"cores: {cores}; attainable (2048^2 float32 matmul): {peak1:.0f} GFLOP/s on 1 thread, {peakn:.0f} on {cores}",
        flush=True,
    )
    measured = {}
    for preset in args.presets or ["pong"]:
        measured[preset] = measure_preset(preset, args, cores, peak1, peakn)
    if not args.skip_sb3:
        cfg, spec, fwd, first = pong_setup("pong")  # SB3 runs the zoo's settings: the pong preset's network
        sb3 = sb3_sps(args.seconds, args.warmup, args.sb3_envs, args.sb3_subproc, args.device)
        sb3_flops = sb3 * (fwd + 4 * (3 * fwd - first)) / 1e9  # acting (actions and values in one forward), 4 epochs
        print(
            f"SB3 PPO (zoo Atari settings, {args.sb3_envs} envs{' in subprocesses' if args.sb3_subproc else ''}, "
            f"learner on {args.device}, {cores} threads): {sb3:.0f} env steps/s, "
            f"{sb3_flops:.1f} GFLOP/s = {sb3_flops / peakn:.2f} of attainable"
        )
        for preset, sps in measured.items():
            print(f"rlfarm --preset {preset} / SB3: {sps / sb3:.2f}x")


def measure_alone(
    preset: str, cfg, spec, fwd: float, fwd_bwd: float, learned_per_step: float, threads: int, peak1: float
):
    """The preset's learner (on the CPU, the trainer's threads) and actor (one thread) alone."""
    per_update = cfg.farm.num_tasks if cfg.mode == "sync" else max(1, cfg.async_.results_per_update or 1)
    batch = cfg.farm.steps_per_env * cfg.env.num_envs * per_update
    update = learner_update_seconds(cfg, spec, threads)
    peak_t = peak1 if threads == 1 else matmul_gflops(threads)
    learner_rate = batch * learned_per_step / update / 1e9
    print(
        f"[{preset}] CNN: {fwd / 1e6:.1f} MFLOP forward per observation, {fwd_bwd / 1e6:.1f} forward+backward; "
        f"learned per env step: {learned_per_step / 1e6:.1f} MFLOP"
    )
    print(
        f"[{preset}] learner alone ({threads} thread(s)): {update:.3f} s per {batch} env steps, {batch / update:.0f} "
        f"env steps/s, {learner_rate:.1f} GFLOP/s = {learner_rate / peak_t:.2f} of attainable",
        flush=True,
    )
    act, kind = actor_step_seconds(cfg, spec, cfg.env.num_envs)
    actor_rate = cfg.env.num_envs * fwd / act / 1e9
    print(
        f"[{preset}] actor alone ({kind}, 1 thread, batch {cfg.env.num_envs}): {act * 1e3:.2f} ms per step, "
        f"{actor_rate:.1f} GFLOP/s = {actor_rate / peak1:.2f} of attainable",
        flush=True,
    )


def measure_preset(preset: str, args, cores: int, peak1: float, peakn: float) -> float:
    """The preset's learner and actor alone, then its training's env steps/s; returns that."""
    cfg, spec, fwd, first = pong_setup(preset)
    from rlfarm.config import local_workers, trainer_threads

    threads = trainer_threads(cfg, spec.is_image, local_workers(cfg), cores)
    epochs = cfg.ppo.update_epochs
    fwd_bwd = 3 * fwd - first  # backward = 2 x forward, less the first layer's input gradient
    # SYNC PPO's values come with the rollout; APPO with one epoch learns in one pass (V-trace's
    # targets from the loss's own forward); with more, a forward over the batch gives the targets first.
    # APPO's circular buffer learns each batch batch_passes times.
    learned_per_step = (epochs * fwd_bwd + (0 if cfg.mode == "sync" or epochs == 1 else fwd)) * cfg.ppo.batch_passes
    if not args.skip_alone:
        measure_alone(preset, cfg, spec, fwd, fwd_bwd, learned_per_step, threads, peak1)

    extra = [f"--set={o}" for o in args.overrides] + ([f"--workers={args.workers}"] if args.workers else [])
    extra.append(f"--device={args.device}")
    sps, last = rlfarm_sps(preset, args.seconds, args.warmup, extra)
    print(
        f"rlfarm train --preset {preset} {' '.join(extra)}: {sps:.0f} env steps/s "
        f"(slots waiting {float(last.get('farm/slots_waiting') or 0):.2f}, learner busy "
        f"{learner_busy(last):.2f}, policy lag "
        f"{float(last.get('farm/policy_lag') or 0):.1f} (max {float(last.get('farm/policy_lag_max') or 0):.0f}), "
        f"tasks in flight {float(last.get('farm/window') or 0):.1f})",
        flush=True,
    )
    print(
        f"  learner delivered {sps * learned_per_step / 1e9:.1f} GFLOP/s, actors "
        f"{sps * fwd / 1e9:.1f}: {(sps * (learned_per_step + fwd)) / 1e9 / peakn:.2f} of the machine's attainable"
    )
    return sps


if __name__ == "__main__":
    main()

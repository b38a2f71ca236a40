"""The trainer's ingest ceiling: how many env steps a second one trainer process takes in, for results
of real sizes, with a learner that does nothing. Receiving (BLPOP from a real redis-server), the
signature check, decoding (msgpack, zstd) and stacking a batch are the trainer's own calls
(rlfarm.trainer.channel.TaskChannel.receive, Rollout.from_dict, rollout.concat); only the learner is
left out. So 1 / (trainer CPU per result) is how many results a second one trainer core can take,
and divided by a worker's rate, how many workers it can feed.

    python benchmarks/ingest.py                              # cartpole, halfcheetah, pong; 8 s each
    python benchmarks/ingest.py --workloads pong --seconds 20 --producers 3

Per workload, one result is made as a worker makes it: its preset's env, vectorised as on a worker,
stepped by the preset's untrained network for one task (Pong: ALE frames, 84x84, four stacked, uint8,
compressed as `farm.compress` says), encoded (rlfarm.worker.results.encode_result) and sealed with a
secret. `--producers` processes push copies of it into Redis as fast as the trainer takes them
(each keeps the list at most --backlog long, so Redis holds a bounded queue, as the farm's
back-pressure does). The consumer takes `--batch` results, decodes them and concatenates their
rollouts into one batch, like the ASYNC trainer before an update, then drops it.

Each consumer runs in a process of its own, in three ways: "before" (the receive path inline, with
glibc's default heap, as the trainer was), "inline" (the heap kept for reuse, rlfarm.trainer.ingest.
keep_freed_memory, as the trainer does now) and "thread" (rlfarm.trainer.ingest.Ingest, the ASYNC
trainer's with `async.ingest = "thread"`: a thread takes and decodes, the main thread only stacks).

`--learner`: also with the learner busy at the same time, as in an ASYNC run: the preset's own
learner (in async mode, on `--device`) learns from the decoded results, and between its minibatches
takes in what arrived (inline) or what the thread decoded (thread). Against the same learner fed
results decoded beforehand ("alone"), that shows what taking results in costs the learner.

    python benchmarks/ingest.py --workloads pong-appo --learner --device cuda

Workloads whose env is not installed (the atari and mujoco extras) are skipped with the reason.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RUN = "ingest"
SECRET = b"ingest-benchmark-secret-0123456789"
WORKLOADS = {  # name: (preset, a worker's env steps per second, for "workers fed"; the pace beside a learner)
    "cartpole": ("cartpole-ppo", 20_000, 200_000),  # issue 36's goals: CartPole-sized >= 200,000 env steps/s
    "halfcheetah": ("halfcheetah-ppo", 5_000, 50_000),
    "pong": ("pong", 500, 20_000),  # a Pong worker process acts ~500 env steps/s (benchmarks/pong.py); 40 workers
    "pong-appo": ("pong-appo", 800, 20_000),  # its smaller CNN at 42x42 acts faster (benchmarks/pong.py)
}
WAYS = ("before", "inline", "thread")


def make_result(preset: str) -> tuple[bytes, int, dict]:
    """One sealed result of `preset`'s task size; (bytes, env steps in it, what it holds)."""
    from rlfarm import algos
    from rlfarm.api import make_config
    from rlfarm.config import to_dict
    from rlfarm.core import signing
    from rlfarm.core.protocol import Result
    from rlfarm.core.rollout import collect, task_seeds
    from rlfarm.envs import describe, make_vector_env
    from rlfarm.worker.results import encode_result

    cfg = make_config(preset)
    env_options = to_dict(cfg)["env"]
    spec = describe(cfg.env.id, env_options)
    envs = make_vector_env(cfg.env.id, cfg.env.num_envs, options=env_options)
    actor = algos.network_for(cfg.algo, spec, cfg.policy).actor_snapshot()
    env_seeds, action_seed = task_seeds(cfg.seed, 0, 0, cfg.env.num_envs)
    keep_next_obs = algos.learner(cfg.algo, cfg.mode).collect_next_obs
    rollout = collect(actor, envs, cfg.farm.steps_per_env, env_seeds, action_seed, keep_next_obs=keep_next_obs)
    envs.close()
    result = Result("rollout", 0, 0, version=0, worker="ingest@bench", rollout=rollout.to_dict())
    payload = encode_result(result, to_dict(cfg)["farm"])
    steps = int(rollout.rewards.size)
    raw = sum(v.nbytes for v in rollout.to_dict().values() if hasattr(v, "nbytes"))
    return signing.seal_result(RUN, payload, SECRET), steps, {"raw_bytes": raw, "compress": cfg.farm.compress}


def produce(url: str, blob: bytes, backlog: int, stop: mp.Event) -> None:
    """Push copies of `blob` while the list is shorter than `backlog`."""
    import redis

    from rlfarm.farm import keys

    client = redis.Redis.from_url(url)
    key = keys.results(RUN)
    while not stop.is_set():
        room = backlog - client.llen(key)
        if room <= 0:  # not sooner: polling Redis takes the cores the measured trainer runs on
            time.sleep(0.002)
            continue
        pipe = client.pipeline(transaction=False)
        for _ in range(min(room, 8)):
            pipe.rpush(key, blob)
        pipe.execute()


class Receiver:
    """The trainer's receive path, one of WAYS: `take(timeout)` is the next decoded rollout or None;
    `cpu` the CPU seconds spent receiving and decoding (the thread's own, for "thread")."""

    def __init__(self, url: str, way: str):
        import redis

        from rlfarm.farm import keys
        from rlfarm.trainer.ingest import Ingest, keep_freed_memory

        if way != "before":
            keep_freed_memory()
        self.client = redis.Redis.from_url(url)
        self.key = keys.results(RUN)
        self.ingest = Ingest(self.client, RUN, SECRET) if way == "thread" else None
        self.cpu = 0.0

    def take(self, timeout: float):
        from rlfarm.core.rollout import Rollout

        if self.ingest is not None:
            item = self.ingest.take(timeout)
            if item is None:
                return None
            self.cpu += item[2]
            return Rollout.from_dict(item[1].rollout)
        t0 = time.process_time()
        if timeout > 0:
            item = self.client.blpop([self.key], timeout=timeout)
            raw = None if item is None else item[1]
        else:
            raw = self.client.lpop(self.key)
        if raw is None:
            return None
        rollout = decoded(raw)
        self.cpu += time.process_time() - t0
        return rollout

    def close(self) -> None:
        if self.ingest is not None:
            self.ingest.close()


def async_learner(preset: str, device: str):
    """The preset's learner in async mode on `device`, one torch thread, as in an ASYNC run."""
    import torch

    from rlfarm import config as C
    from rlfarm.algos import learner
    from rlfarm.envs import describe

    torch.set_num_threads(1)
    cfg = C.build(preset, ["mode=async"])
    algorithm = learner(cfg.algo, "async")(cfg, describe(cfg.env.id, C.to_dict(cfg)["env"]), torch.device(device))
    algorithm.on_farm(8)
    return algorithm


def decoded(blob: bytes):
    """`blob`'s rollout, opened and decoded as the trainer does."""
    from rlfarm.core import codec, signing
    from rlfarm.core.protocol import Result
    from rlfarm.core.rollout import Rollout

    return Rollout.from_dict(Result.from_message(codec.unpack(signing.open_result(RUN, blob, SECRET))).rollout)


def busy_learner(preset: str, device: str, blob: bytes, stop: threading.Event, learned: list[int]) -> None:
    """The preset's learner learning from copies of `blob`'s rollout, decoded once, until `stop`;
    `learned[0]`: env steps learned so far."""
    import torch

    algorithm = async_learner(preset, device)
    rollout = decoded(blob)
    while not stop.is_set():
        algorithm.observe(rollout, policy_lag=0)
        while algorithm.ready():
            algorithm.update(0.5)
        if device == "cuda":
            torch.cuda.synchronize()
        learned[0] += rollout.num_steps


def consume(
    url: str,
    way: str,
    seconds: float,
    batch: int,
    steps_per_result: int,
    busy: tuple | None = None,
    pace: float | None = None,
) -> dict:
    """The trainer's receive path for `seconds` (after a 1 s warm-up), stacking `batch` results at a
    time as the ASYNC trainer does before an update: results, env steps and CPU. `busy` (preset,
    device, blob): with that preset's learner learning at the same time, in a thread of its own.
    `pace`: take results in at this many env steps a second at most (a farm of that rate)."""
    from rlfarm.core.rollout import concat

    receiver = Receiver(url, way)
    learned, stop_learning = [0], threading.Event()
    if busy is not None:
        learning = threading.Thread(target=busy_learner, args=(*busy, stop_learning, learned), daemon=True)
        learning.start()
        while learned[0] == 0:  # its first update done: built, warmed up
            if not learning.is_alive():
                raise RuntimeError("the busy learner failed (its traceback is above)")
            time.sleep(0.05)

    def stack() -> None:
        got = []
        while len(got) < batch:
            rollout = receiver.take(timeout=1.0)
            if rollout is not None:
                got.append(rollout)
        concat(got)

    warm = time.monotonic() + 1.0
    while time.monotonic() < warm:
        stack()
    results, cpu0, t0, own0, learned0 = 0, time.process_time(), time.perf_counter(), receiver.cpu, learned[0]
    while time.perf_counter() - t0 < seconds:
        stack()
        results += batch
        if pace is not None:
            time.sleep(max(0.0, t0 + results * steps_per_result / pace - time.perf_counter()))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    learner_rate = (learned[0] - learned0) / wall
    stop_learning.set()
    receiver.close()
    return {
        "learner_env_steps_per_s": learner_rate,
        "results_per_s": results / wall,
        "env_steps_per_s": results * steps_per_result / wall,
        "trainer_cpu_ms_per_result": 1000 * cpu / results,
        "receive_cpu_ms_per_result": 1000 * (receiver.cpu - own0) / results,
        "trainer_cores": cpu / wall,
        "ceiling_env_steps_per_core_s": steps_per_result / (cpu / results),
    }


def learn(url: str | None, way: str, seconds: float, preset: str, device: str, blob: bytes) -> dict:
    """The preset's learner (async mode, on `device`) learning for `seconds` after a warm-up, from
    results taken in `way` between its minibatches; `url` None: from copies of `blob` decoded
    beforehand (the learner alone). Env steps learned per second and the receive path's CPU."""
    import torch

    algorithm = async_learner(preset, device)
    backlog: list = []
    if url is None:
        from rlfarm.trainer.ingest import keep_freed_memory

        keep_freed_memory()
        alone = decoded(blob)
        receiver = None
    else:
        receiver = Receiver(url, way)

    def pump() -> None:  # what the trainer does between minibatches: take in what has arrived
        while receiver is not None and len(backlog) < 8:
            rollout = receiver.take(timeout=0)
            if rollout is None:
                break
            backlog.append(rollout)

    def next_rollout():
        if receiver is None:
            return alone
        while not backlog:
            rollout = receiver.take(timeout=1.0)
            if rollout is not None:
                backlog.append(rollout)
        return backlog.pop(0)

    def run(until: float) -> int:
        steps = 0
        while time.perf_counter() < until:
            rollout = next_rollout()
            algorithm.observe(rollout, policy_lag=0)
            steps += rollout.num_steps
            while algorithm.ready():
                algorithm.update(0.5, between=pump)
                pump()
        if device == "cuda":
            torch.cuda.synchronize()
        return steps

    run(time.perf_counter() + 3.0)  # warm-up: allocations, cuDNN's choices
    own0, t0 = receiver.cpu if receiver else 0.0, time.perf_counter()
    steps = run(t0 + seconds)
    wall = time.perf_counter() - t0
    if receiver is not None:
        receiver.close()
    return {
        "env_steps_per_s": steps / wall,
        "receive_cpu_s_per_s": ((receiver.cpu if receiver else 0.0) - own0) / wall,
    }


def in_process(fn, *args):
    """`fn(*args)` in a fresh process: glibc's heap settings cannot be undone in one."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=["cartpole", "halfcheetah", "pong"])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--backlog", type=int, default=32, help="results waiting in Redis at most")
    parser.add_argument("--batch", type=int, default=8, help="results stacked per batch (results_per_update)")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--learner", action="store_true", help="also with the preset's learner busy (async mode)")
    parser.add_argument("--device", default="cpu", help="the learner's device (--learner)")
    parser.add_argument(
        "--pace", type=float, help="env steps/s of the paced ingest beside the learner (--learner; default: the goal's)"
    )
    args = parser.parse_args()

    from rlfarm.errors import EnvError
    from rlfarm.local.cluster import LocalCluster

    rows, learned, beside = [], [], []
    with LocalCluster(workers=0, name="rlfarm-ingest-bench") as cluster:
        import redis

        from rlfarm.farm import keys

        for name in args.workloads:
            preset, worker_rate, goal = WORKLOADS[name]
            try:
                blob, steps, held = make_result(preset)
            except (EnvError, ImportError) as exc:
                print(f"{name}: skipped: {' '.join(str(exc).split())[:200]}")
                continue
            redis.Redis.from_url(cluster.redis_url).delete(keys.results(RUN))
            stop = mp.Event()
            producers = [
                mp.Process(target=produce, args=(cluster.redis_url, blob, args.backlog, stop), daemon=True)
                for _ in range(args.producers)
            ]
            for p in producers:
                p.start()
            try:
                for way in args.ways:
                    measured = in_process(consume, cluster.redis_url, way, args.seconds, args.batch, steps)
                    rows.append((name, way, steps, len(blob), held, measured, worker_rate))
                    print(f"{name} {way}: {measured['env_steps_per_s']:,.0f} env steps/s", flush=True)
                if args.learner:
                    alone = in_process(learn, None, "alone", args.seconds, preset, args.device, blob)
                    learned.append((name, "alone", alone, alone))
                    for way in ("inline", "thread"):
                        m = in_process(learn, cluster.redis_url, way, args.seconds, preset, args.device, blob)
                        learned.append((name, way, m, alone))
                        print(f"{name} learner, {way}: {m['env_steps_per_s']:,.0f} env steps/s", flush=True)
                    busy = (preset, args.device, blob)
                    for pace in (None, args.pace or goal):
                        m = in_process(
                            consume, cluster.redis_url, "thread", args.seconds, args.batch, steps, busy, pace
                        )
                        beside.append((name, pace, m, alone))
                        print(f"{name} ingest beside the learner: {m['env_steps_per_s']:,.0f} env steps/s", flush=True)
            finally:
                stop.set()
                for p in producers:
                    p.join(timeout=10)

    print()
    print(f"trainer ingest, one process, {args.producers} producer processes, batches of {args.batch} results")
    head = "workload     way     env steps  bytes/result   raw bytes  results/s  env steps/s  CPU ms/result"
    print(head + "  receive ms  ceiling/core  workers fed")
    for name, way, steps, size, held, m, rate in rows:
        ceiling = m["ceiling_env_steps_per_core_s"]
        print(
            f"{name:<12} {way:<7} {steps:>9,}  {size:>12,}  {held['raw_bytes']:>10,}  {m['results_per_s']:>9.1f}  "
            f"{m['env_steps_per_s']:>11,.0f}  {m['trainer_cpu_ms_per_result']:>13.2f}  "
            f"{m['receive_cpu_ms_per_result']:>10.2f}  {ceiling:>12,.0f}  {ceiling / rate:>5.0f} at {rate:,}/s"
        )
    print(
        "before: the receive path inline, glibc's default heap; inline: the heap kept for reuse; thread: "
        "the ingest thread (async.ingest = thread). CPU ms/result: the whole process's, stacking "
        "included; receive ms: receiving and decoding only. ceiling/core: env steps/s one trainer core "
        "could take in (steps per result / CPU per result); workers fed: that ceiling over a worker's "
        "rate. The measured rate shares this machine's cores with the producers and Redis."
    )
    if learned:
        print()
        print(
            f"the learner busy (async mode, {args.device}, one torch thread), results taken in between its minibatches"
        )
        print("workload     way     env steps/s learned  vs alone  receive CPU (cores)")
        for name, way, m, alone in learned:
            ratio = m["env_steps_per_s"] / alone["env_steps_per_s"]
            print(
                f"{name:<12} {way:<7} {m['env_steps_per_s']:>19,.0f}  {ratio:>8.2f}  {m['receive_cpu_s_per_s']:>19.3f}"
            )
        print("alone: the learner fed results decoded beforehand, no receiving at all")
        print()
        print("the ingest thread taking results in while the learner learns at the same time (in a second thread,")
        print("from a result decoded beforehand), as fast as it can and paced at the goal's rate (--pace)")
        print("workload     paced at    ingest env steps/s  CPU ms/result  learner env steps/s  vs alone")
        for name, pace, m, alone in beside:
            paced = "as fast" if pace is None else f"{pace:,.0f}/s"
            learner = m["learner_env_steps_per_s"]
            shown = (
                f"{learner:>19,.0f}  {learner / alone['env_steps_per_s']:>8.2f}" if learner else "  (no update ended)"
            )
            rate, cpu = m["env_steps_per_s"], m["trainer_cpu_ms_per_result"]
            print(f"{name:<12} {paced:>9}  {rate:>20,.0f}  {cpu:>13.2f}  {shown}")
        print("CPU ms/result: the whole process's, the learner's included")


if __name__ == "__main__":
    main()

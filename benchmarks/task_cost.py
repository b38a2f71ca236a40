"""Cost per task, broken down: trainer CPU per result, Redis CPU per task, the worker's overhead beyond
the rollout itself, and bytes on the wire; for a CartPole-sized and an image-sized result.

    python benchmarks/task_cost.py
    python benchmarks/task_cost.py --tasks 300 --image-tasks 8 --image-env ALE/Pong-v5
    python benchmarks/task_cost.py --before /tmp/rlfarm-before   # the same, also against an older checkout

Sizes: CartPole-v1, 1 env x 64 steps (a result of ~5 KB); image: ALE/Pong-v5 with DeepMind's
preprocessing, 8 envs x 128 steps of 4x84x84 uint8 (the Nature CNN acting on CPU), or
benchmarks.slow_envs:frames (Atari-shaped frames) where ale_py is not installed. One private
redis-server; every figure below comes from this one run.

  (A) in-process, no Celery worker: this process is the trainer (a TaskChannel) and the worker (a
      TaskHandler, whose `handle` takes each task message popped from the broker queue). Each side
      is measured in a phase of its own (all submits, then all handles, then all receives): wall and
      CPU time of this process, its round trips to Redis (every request redis-py sends, a pipeline
      being one), and Redis's own counters (INFO: CPU, network bytes, calls per command). The rollout
      alone is `collect` of the same tasks with the same actor and envs, without anything around it.
  (B) the farm: one `rlfarm worker` node with one pool process, one task in flight at a time. From
      the trainer's and the worker's clocks (the same machine): delivery (submit called -> the
      worker's handle began: broker, Celery's consumer, the pool process), the worker's timings, and
      the way back (rollout done -> the trainer has it: encode, push, BLPOP wake-up). CPU per task of
      the node's main process (Celery's consumer: delivery, ack), of its pool process beyond the
      rollout, of this trainer and of Redis.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
import farmstats as fs  # noqa: E402


def spec(i: int, steps: int, version: int | str = 0) -> dict[str, Any]:
    return {"iteration": i, "index": 0, "version": version, "steps": steps, "seed": 1}


def decode_message(raw: bytes) -> tuple[dict[str, Any], str]:
    """A Celery task message as kombu keeps it in Redis (JSON, body base64 of msgpack [args, kwargs,
    embed]): the task's kwargs and id, as a worker's pool process gets them."""
    message = json.loads(raw)
    _, kwargs, _ = msgpack.unpackb(base64.b64decode(message["body"]), raw=False)
    return kwargs, message["headers"]["id"]


class Timed:
    """Wall seconds and sizes of the worker's encode and push, by wrapping them in this process."""

    def __init__(self) -> None:
        self.encode: list[float] = []
        self.push: list[float] = []
        self.payload: list[int] = []

    def install(self, worker: Any) -> None:
        import rlfarm.worker.handler as wm

        encode, push = wm.encode_result, worker._push

        def timed_encode(result: Any, farm: dict[str, Any]) -> bytes:
            t = time.perf_counter()
            payload = encode(result, farm)
            self.encode.append(time.perf_counter() - t)
            self.payload.append(len(payload))
            return payload

        def timed_push(*args: Any, **kwargs: Any) -> None:
            t = time.perf_counter()
            push(*args, **kwargs)
            self.push.append(time.perf_counter() - t)

        wm.encode_result = timed_encode
        worker._push = timed_push


# ---- (A) in-process ------------------------------------------------------------------------------
def in_process(url: str, run: str, steps: int, n: int, rounds: int) -> dict[str, Any]:
    """`n` tasks in `rounds` rounds; each round submits, hands to the worker, receives, then runs the
    rollout alone, so that a slow spell of this shared machine hits the rollout alone and inside
    handle alike."""
    from rlfarm.core.rollout import collect, task_seeds
    from rlfarm.farm.app import make_app
    from rlfarm.farm.connection import connect
    from rlfarm.worker.handler import TaskHandler

    client = connect(url)
    app = make_app(url)
    queue = app.conf.task_default_queue
    d = fs.task_channel(app, client, run, 600, 1)
    worker = TaskHandler(url)
    timed = Timed()
    timed.install(worker)
    meters = {k: fs.Meter() for k in ("submit", "handle", "receive", "alone")}

    def one_round(first: int, count: int) -> tuple[list[Any], float]:
        with meters["submit"].measure(client):
            for i in range(first, first + count):
                d.submit(spec(i, steps))
        raws = [client.rpop(queue) for _ in range(count)]  # the broker's delivery, done by hand
        with meters["handle"].measure(client):
            for raw in raws:
                worker.handle(*decode_message(raw))
        got: list[Any] = []
        with meters["receive"].measure(client):
            while len(got) < count:
                message = d.next_result(timeout=1.0)
                if message is not None:
                    got.append(message)
        # The rollout alone: the same tasks, the same actor and envs, nothing around them.
        env_cfg = worker._run_meta(run)["config"]["env"]
        actor, _, _ = worker._actor_of(run, 0)
        envs = worker._vector_env(env_cfg)
        with meters["alone"].measure(client):
            for i in range(first, first + count):
                seeds, action_seed = task_seeds(1, i, 0, env_cfg["num_envs"])
                collect(actor, envs, steps, seeds, action_seed)
        return got, sum(len(r) for r in raws)

    one_round(0, 2)  # warm-up: envs made, policy fetched and cached, connections open
    meters = {k: fs.Meter() for k in meters}
    for k in ("encode", "push", "payload"):
        getattr(timed, k).clear()
    decode0 = d.stats.receive_seconds
    results, message_bytes = [], 0
    size = -(-n // rounds)
    for first in range(1000, 1000 + n, size):
        got, nbytes = one_round(first, size)
        results += got
        message_bytes += nbytes
    n = len(results)
    decode = (d.stats.receive_seconds - decode0) / n

    # A new version: the first task of each process that acts with it fetches it and builds its actor.
    fetch = []
    for _ in range(3):
        worker.versions.cache = type(worker.versions.cache)(size=4)
        t = time.perf_counter()
        worker._actor_of(run, 0)
        fetch.append(time.perf_counter() - t)

    timings = [r.timings for r in results]
    alone = meters["alone"]
    return {
        "n": n,
        "alone_wall": alone.wall / n,
        "alone_cpu": alone.cpu / n,
        **{k: per_task(meters[k], n) for k in ("submit", "handle", "receive")},
        "decode_cpu": decode,
        "checks": fs.mean([t["checks"] for t in timings]),
        "policy": fs.mean([t["policy"] for t in timings]),
        "collect": fs.mean([t["collect"] for t in timings]),
        "encode": fs.mean(timed.encode),
        "push": fs.mean(timed.push),
        "payload": fs.mean(timed.payload),
        "message_bytes": message_bytes / n,
        "fetch": statistics.median(fetch),
    }


def per_task(meter: fs.Meter, n: int) -> dict[str, Any]:
    r = meter.redis
    return {
        "wall": meter.wall / n,
        "cpu": meter.cpu / n,
        "trips": meter.trips / n,
        "redis_cpu": r.cpu / n,
        "net_in": r.net_in / n,
        "net_out": r.net_out / n,
        "calls": {k: v / n for k, v in r.calls.items()},
        "redis_usec": {k: v / n for k, v in r.usec.items()},
    }


# ---- (B) the farm: one node, one pool process, one task in flight -------------------------------
SETTLE = 0.05  # after the last task of a window: the node's ack of it lands inside the window


def farm_serial(cluster: Any, url: str, run: str, network: Any, steps: int, n: int) -> dict[str, Any]:
    """`n` tasks acting with a cached policy, then `n` each acting with a version published just
    before it (as in training: SYNC publishes every iteration, APPO every update). Redis's figures
    for the second exclude the publishing, measured alone and subtracted: the trainer's cost."""
    from rlfarm.farm.app import make_app
    from rlfarm.farm.connection import connect
    from rlfarm.farm.policies.store import PolicyStore

    node = cluster.add_worker(1, command=fs.node_command())
    client = connect(url)
    d = fs.task_channel(make_app(url), client, run, 600, 1)
    store = PolicyStore(client, run, keep=3)

    def one(i: int, version: int, lines: list[fs.Timeline], cpu: list[float]) -> None:
        c0 = time.process_time()
        submitted = time.time()
        d.submit(spec(i, steps, version))
        c1 = time.process_time()
        message = None
        while message is None:
            message = d.next_result(timeout=1.0)
        received = time.time()
        cpu[0] += c1 - c0
        cpu[1] += time.process_time() - c1
        lines.append(fs.Timeline(submitted, received, message))

    for i in range(3):  # warm-up: the pool process makes its envs and caches the policy
        one(i, 0, [], [0.0, 0.0])
    out = {}
    for variant, first in (("cached", 1000), ("new", 2000)):
        lines: list[fs.Timeline] = []
        cpu = [0.0, 0.0]
        meter, publishing = fs.Meter(), fs.Meter()
        main0, pool0 = fs.node_cpu([node.pid])
        with meter.measure(client):
            for i in range(first, first + n):
                version = 0
                if variant == "new":
                    version = i
                    store.publish(version, network.state_dict(), "ppo")
                one(i, version, lines, cpu)
            time.sleep(SETTLE)
        main1, pool1 = fs.node_cpu([node.pid])
        if variant == "new":
            with publishing.measure(client):
                for i in range(first + n, first + 2 * n):
                    store.publish(i, network.state_dict(), "ppo")
        r = meter.redis.minus(publishing.redis)
        out[variant] = {
            "n": n,
            "total": fs.mean([x.received - x.submitted for x in lines]),
            "delivery": fs.mean([x.delivery for x in lines]),
            "back": fs.mean([x.back for x in lines]),
            "checks": fs.mean([x.result.timings["checks"] for x in lines]),
            "policy": fs.mean([x.result.timings["policy"] for x in lines]),
            "collect": fs.mean([x.result.timings["collect"] for x in lines]),
            "submit_cpu": cpu[0] / n,
            "receive_cpu": cpu[1] / n,
            "main_cpu": (main1 - main0) / n,
            "pool_cpu": (pool1 - pool0) / n,
            "redis_cpu": r.cpu / n,
            "net_in": r.net_in / n,
            "net_out": r.net_out / n,
            "calls": {k: v / n for k, v in r.calls.items()},
        }
    return out


# ---- report ---------------------------------------------------------------------------------------
def measure(args: argparse.Namespace) -> dict[str, Any]:
    from rlfarm.farm.connection import connect
    from rlfarm.local.cluster import LocalCluster

    fs.RoundTrips.install()
    out = {}
    for name, env_id, num_envs, steps, n_a, n_b in sizes(args):
        with LocalCluster(workers=0, name=f"rlfarm-cost-{name}", extra_env=fs.worker_env()) as cluster:
            client = connect(cluster.redis_url)
            fs.make_run(client, f"a-{name}", env_id, num_envs)
            network = fs.make_run(client, f"b-{name}", env_id, num_envs)
            a = in_process(cluster.redis_url, f"a-{name}", steps, n_a, rounds=min(n_a, 6))
            a["policy_bytes"] = client.strlen(f"rlfarm:a-{name}:policy:0")
            b = farm_serial(cluster, cluster.redis_url, f"b-{name}", network, steps, n_b)
        out[name] = {"env": env_id, "num_envs": num_envs, "steps": steps, "a": a, "b": b}
    return out


def sizes(args: argparse.Namespace) -> list[tuple[str, str, int, int, int, int]]:
    image = args.image_env
    if image.startswith("ALE/"):
        try:
            import ale_py  # noqa: F401
        except ImportError:
            print(f"ale_py is not installed: the image size is benchmarks.slow_envs:frames instead of {image}")
            image = "benchmarks.slow_envs:frames"
    return [
        ("cartpole", "CartPole-v1", 1, 64, args.tasks, args.farm_tasks),
        ("image", image, 8, 128, args.image_tasks, args.image_tasks),
    ]


def ms(x: float) -> str:
    return f"{1e3 * x:.3f}"


def rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, figure) lines of one size's column."""
    a, cached, new = f["a"], f["b"]["cached"], f["b"]["new"]
    phases = ("submit", "handle", "receive")
    rest = a["handle"]["wall"] - a["checks"] - a["policy"] - a["collect"] - a["encode"] - a["push"]
    out = [
        ("rollout alone: collect() in-process, wall ms", ms(a["alone_wall"])),
        ("rollout alone, CPU ms", ms(a["alone_cpu"])),
        ("(A) TRAINER per result, CPU ms: submit (the replacement)", ms(a["submit"]["cpu"])),
        ("    receive: BLPOP, open, decode, accounting", ms(a["receive"]["cpu"])),
        ("      of which decode (TaskChannel receive_seconds)", ms(a["decode_cpu"])),
        ("    trainer CPU per result, total", ms(a["submit"]["cpu"] + a["receive"]["cpu"])),
        ("    Redis round trips: submit / receive", f"{a['submit']['trips']:.1f} / {a['receive']['trips']:.1f}"),
        ("(A) WORKER per task, in-process handle, wall ms", ms(a["handle"]["wall"])),
        ("    handle - rollout alone = overhead, wall ms", ms(a["handle"]["wall"] - a["alone_wall"])),
        ("      checks: INCR/EXPIRE/SMISMEMBER, signature, lease", ms(a["checks"])),
        ("      policy-cache lookup (cached version)", ms(a["policy"])),
        ("      collect inside handle - rollout alone", ms(a["collect"] - a["alone_wall"])),
        ("      encode", ms(a["encode"])),
        ("      push (RPUSH/EXPIRE/DEL/SREM transaction)", ms(a["push"])),
        ("      rest (lease release, Result, ...)", ms(rest)),
        ("    handle CPU - rollout alone CPU, ms", ms(a["handle"]["cpu"] - a["alone_cpu"])),
        ("    Redis round trips", f"{a['handle']['trips']:.1f}"),
        ("    policy fetch of a new version, wall ms", ms(a["fetch"])),
        (
            "(A) REDIS CPU per task, us: submit/handle/receive",
            "/".join(f"{1e6 * a[k]['redis_cpu']:.0f}" for k in phases),
        ),
        ("    Redis CPU per task, total us (INFO cpu)", f"{1e6 * sum(a[k]['redis_cpu'] for k in phases):.0f}"),
        (
            "    of which inside commands, us (commandstats)",
            f"{sum(sum(a[k]['redis_usec'].values()) for k in phases):.0f}",
        ),
        ("BYTES per task: task message (broker)", f"{a['message_bytes']:.0f}"),
        ("    result payload", f"{a['payload']:.0f}"),
        ("    policy version (GET once per process per version)", f"{a['policy_bytes']:.0f}"),
        ("    Redis net in + out, (A) in-process", f"{sum(a[k]['net_in'] + a[k]['net_out'] for k in phases):.0f}"),
        ("    Redis net in + out, (B) farm", f"{cached['net_in'] + cached['net_out']:.0f}"),
    ]
    for label, b in (("cached policy", cached), ("a new version each task", new)):
        out += [
            (f"(B) FARM, {label}: submit -> result, ms", ms(b["total"])),
            ("    minus rollout alone = farm overhead per task, ms", ms(b["total"] - a["alone_wall"])),
            ("      delivery: submit called -> handle began", ms(b["delivery"])),
            ("      checks (worker timings)", ms(b["checks"])),
            ("      policy (worker timings)", ms(b["policy"])),
            ("      collect - rollout alone", ms(b["collect"] - a["alone_wall"])),
            ("      back: rollout done -> trainer has it", ms(b["back"])),
            ("    CPU ms per task: node main process (Celery)", ms(b["main_cpu"])),
            ("      pool process - rollout alone", ms(b["pool_cpu"] - a["alone_cpu"])),
            ("      trainer: submit + receive", ms(b["submit_cpu"] + b["receive_cpu"])),
            ("      Redis", ms(b["redis_cpu"])),
            (
                "      all but the rollout",
                ms(
                    b["main_cpu"] + b["pool_cpu"] - a["alone_cpu"] + b["submit_cpu"] + b["receive_cpu"] + b["redis_cpu"]
                ),
            ),
            ("    Redis commands per task", f"{sum(b['calls'].values()):.1f}"),
        ]
    return out


def report(results: dict[str, Any], before: dict[str, Any] | None = None) -> None:
    names = list(results)
    cols = [f"{n} {results[n]['num_envs']}x{results[n]['steps']}" for n in names]
    if before:
        cols = [c for n in names for c in (f"{n} before", f"{n} after")]
    width = 55
    print(f"{'':<{width}}" + "".join(f"{c:>16}" for c in cols))
    table = {n: rows(results[n]) for n in names}
    old = {n: rows(before[n]) for n in names} if before else {}
    for i, (label, _) in enumerate(table[names[0]]):
        cells = []
        for n in names:
            if before:
                cells.append(old[n][i][1])
            cells.append(table[n][i][1])
        print(f"{label:<{width}}" + "".join(f"{c.strip():>16}" for c in cells))
    for n in names:
        print(f"\nRedis commands per task, {n} ({results[n]['env']}):")
        a, b = results[n]["a"], results[n]["b"]
        for phase in ("submit", "handle", "receive"):
            print(f"  (A) {phase:<8} {_calls(a[phase]['calls'])}")
        print(f"  (B) farm     {_calls(b['cached']['calls'])}")


def _calls(calls: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2g}" for k, v in calls.items() if v >= 0.05) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=300, help="CartPole tasks in (A)")
    parser.add_argument("--farm-tasks", type=int, default=200, help="CartPole tasks in (B)")
    parser.add_argument("--image-tasks", type=int, default=8, help="image tasks in (A) and (B)")
    parser.add_argument("--image-env", default="ALE/Pong-v5")
    parser.add_argument(
        "--before", help="an older rlfarm checkout: measured too, in a child process, and printed side by side"
    )
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    print(fs.header("Cost per task (benchmarks/task_cost.py)"))
    before = None
    if args.before:
        before = run_child(args.before, sys.argv[1:])
    results = measure(args)
    fs.dump(args.json, results)
    report(results, before)
    print(f"\nload average at the end: {fs.loadavg()}")


def run_child(root: str, argv: list[str]) -> dict[str, Any]:
    """This script against another checkout (on PYTHONPATH), its figures read back from JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "before.json")
        args = [a for i, a in enumerate(argv) if a != "--before" and (i == 0 or argv[i - 1] != "--before")]
        env = {**os.environ, "PYTHONPATH": root}
        print(f"(measuring {root} first, in a child process)", flush=True)
        subprocess.run(
            [sys.executable, __file__, *args, "--json", path], env=env, check=True, stdout=subprocess.DEVNULL
        )
        return json.loads(Path(path).read_text())


if __name__ == "__main__":
    main()

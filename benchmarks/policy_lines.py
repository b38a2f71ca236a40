"""What a version line per policy (rlfarm.farm.policies.lines) saves the farm in a run of several policies: the
bytes Redis sends a worker process per published version when it fetches the run's whole version,
against fetching each policy's own version (an unchanged policy, such as a frozen one, not again),
and what the lines cost the trainer: the bytes it writes per version. One run, on the presets'
networks: simple_tag (`tag-ppo`: predators trained, prey frozen) and the two-level four rooms
(`four-rooms-two-level`: upper level trained, lower level frozen), each also with every policy
trained (where the lines save nothing and cost a few more, smaller fetches).

    python benchmarks/policy_lines.py
    python benchmarks/policy_lines.py --versions 20

A worker process's twin (rlfarm.worker.policies.PolicyVersions, the machine's shared copies off)
acts with each version in turn, as tasks of a SYNC run do. Redis's own counter (INFO stats
total_net_output_bytes) gives the bytes; only this process talks to this Redis.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = (("tag-ppo", "agent"), ("four-rooms-two-level", None))  # preset, the policy left frozen


def trial(url: str, run: str, meta: dict, versions: int, lines: bool, store) -> dict:
    import redis

    from rlfarm.worker.policies import PolicyVersions

    client = redis.Redis.from_url(url)
    worker = PolicyVersions(client, None, lambda _: meta, {}, Counter())
    times = []
    before = client.info("stats")["total_net_output_bytes"]
    for v in range(versions):
        started = time.perf_counter()
        worker.actor(run, v, store.lines_of(v) if lines else None)
        times.append(time.perf_counter() - started)
    after = client.info("stats")["total_net_output_bytes"]
    return {"bytes": (after - before) / versions, "ms": statistics.median(times) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=10)
    args = parser.parse_args()

    import torch

    from rlfarm import config as C
    from rlfarm.algos import network_for
    from rlfarm.core import codec
    from rlfarm.envs import describe
    from rlfarm.errors import EnvError
    from rlfarm.farm.connection import connect
    from rlfarm.farm.policies.lines import LinedStore
    from rlfarm.local.cluster import LocalCluster

    print(f"policy_lines: bytes Redis sends a worker process per version, {args.versions} versions a case")
    print(
        f"{'preset':<22} {'trained':<16} {'whole KB/v':>10} {'lines KB/v':>10} {'lines/whole':>11} "
        f"{'trainer writes':>14} {'ms whole':>8} {'ms lines':>8}"
    )
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(workers=0, name="rlfarm-bench-lines", log_dir=Path(tmp)) as cluster,
    ):
        for preset, frozen_name in CASES:
            cfg = C.build(preset, [])
            try:
                space = describe(cfg.env.id, C.to_dict(cfg)["env"])
            except EnvError as exc:
                sys.exit(f"policy_lines.py needs {preset}'s env: {exc}")
            frozen = frozen_name or space.policies[-1]
            for trained in ([p for p in space.policies if p != frozen], list(space.policies)):
                run = f"lines-{preset}-{len(trained)}"
                store = LinedStore(connect(cluster.redis_url), run, space.policies, keep=args.versions + 1)
                meta = {"config": C.to_dict(cfg), "space": space.to_dict()}
                store.set_run_meta(meta)
                torch.manual_seed(0)
                network = network_for(cfg.algo, space, cfg.policy)
                writes = []  # the trainer's bytes per version with the lines, over the whole version's
                for v in range(args.versions):
                    with torch.no_grad():
                        for name in trained:
                            for p in network.nets[name].parameters():
                                p.add_(0.001)
                    heads = store.heads
                    whole = len(store.publish(v, codec.wire_state(network.state_dict(), "float32"), cfg.algo))
                    changed = [n for n, line in store.lines.items() if store.heads[n] != heads.get(n)]
                    if v:  # the first version writes every line
                        writes.append((whole + sum(len(store.lines[n].own[1]) for n in changed)) / whole)
                whole_r = trial(cluster.redis_url, run, meta, args.versions, False, store)
                lines_r = trial(cluster.redis_url, run, meta, args.versions, True, store)
                label = ",".join(trained)
                print(
                    f"{preset:<22} {label:<16} {whole_r['bytes'] / 1e3:>10.1f} {lines_r['bytes'] / 1e3:>10.1f} "
                    f"{lines_r['bytes'] / whole_r['bytes']:>11.2f} {statistics.median(writes):>13.2f}x "
                    f"{whole_r['ms']:>8.2f} {lines_r['ms']:>8.2f}"
                )
    print("lines/whole: bytes a worker fetches with the lines over fetching whole versions (< 1: saved)")
    print("trainer writes: the bytes the trainer writes per version with the lines, over the whole version alone")


if __name__ == "__main__":
    main()

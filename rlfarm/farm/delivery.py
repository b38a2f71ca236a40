"""A result's way onto its run's `results` list, taken only while the run's trainer lives.

A task that started while its trainer lived may end after the run did: the trainer has deleted the
run's `wanted` set and result lists by then (Channel.finish). Pushing that result would leave a list
behind for RESULTS_TTL that nothing will ever pop, and a stream snapshot nothing will continue. So the
push, the snapshot, the lease and attempts deletions and the `wanted` removal are one Lua script that
first asks whether `wanted` still holds LIVE: a run that ended gets nothing but the deletions.

The writes come before the deletions, so a Redis at maxmemory refuses the script (an OOM error, see
rlfarm.farm.outage.is_oom) before it deleted anything, as the MULTI transaction it replaces did.
"""

from __future__ import annotations

import redis

from rlfarm.farm import keys

# KEYS: wanted, results, the keys to delete (ARGV[2] of them), then the snapshot's key if any.
# ARGV: LIVE, how many keys to delete, payload, results TTL, the `wanted` member to remove ('' none),
# the snapshot's bytes and its TTL (with a snapshot key only).
_DELIVER = """
local deletes = tonumber(ARGV[2])
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
    for i = 3, 2 + deletes do redis.call('DEL', KEYS[i]) end
    return 0
end
local snapshot = KEYS[3 + deletes]
if snapshot then redis.call('SET', snapshot, ARGV[6], 'EX', ARGV[7]) end
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[4])
for i = 3, 2 + deletes do redis.call('DEL', KEYS[i]) end
if ARGV[5] ~= '' then redis.call('SREM', KEYS[1], ARGV[5]) end
return 1
"""


def deliver(
    client: redis.Redis,
    run: str,
    payload: bytes,
    *,
    delete: tuple[str, ...] = (),
    done: str | None = None,
    stream_snapshot: tuple[str, bytes] | None = None,
) -> bool:
    """Push a sealed result onto `run`'s results list with the rest of its transaction, or, when the
    run's trainer is gone, only delete `delete` (the task's lease and attempts counter). True when the
    result was pushed."""
    script_keys = [keys.wanted(run), keys.results(run), *delete]
    args: list[object] = [keys.LIVE, len(delete), payload, keys.RESULTS_TTL, done or ""]
    if stream_snapshot is not None:
        script_keys.append(stream_snapshot[0])
        args += [stream_snapshot[1], keys.STREAM_TTL]
    # EVAL, not EVALSHA: a script cache does not survive a Redis restart or a Sentinel failover, and
    # the script is small next to the results it carries.
    return bool(client.eval(_DELIVER, len(script_keys), *script_keys, *args))

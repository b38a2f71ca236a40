"""Every Redis key of a run, its expiry, and who may write it: the one place that knows the layout.
Everything else asks here for a key; nothing else formats `rlfarm:<run>:...` itself.

All under `rlfarm:<run>:` (besides the broker's own queue, `celery`, and kombu's bindings):

| key                 | type       | written by                                  | expiry                 |
| ------------------- | ---------- | ------------------------------------------- | ---------------------- |
| `meta`              | string     | trainer (run config, spaces, incarnation)   | none (the run's life)  |
| `policy:<v>`        | string     | trainer (safetensors, signed with a secret) | trimmed past keep      |
| `policy:latest`     | string     | trainer, in the publishing transaction      | none                   |
| `versions`          | sorted set | trainer (retained versions)                 | none                   |
| `pinned`            | set        | trainer (best version, those in evaluation) | none                   |
| `policy@<p>:<n>`, `policy@<p>:latest`, `versions@<p>`, `pinned@<p>` | as above | trainer: policy p's own version line, in a run of several policies (rlfarm.farm.policies.lines) | as above |
| `trainer`           | string     | trainer (the run's claim, rlfarm.farm.claim) | CLAIM_SECONDS, renewed |
| `status`            | hash       | trainer (heartbeat for `rlfarm status`)     | STATUS_TTL; its last word (finished, failed, stopped): none |
| `wanted`            | set        | trainer adds task keys and LIVE; a worker removes the key of the task whose result it pushed | none |
| `results`           | list       | workers push while `wanted` holds LIVE (rlfarm.farm.delivery), the trainer pops | RESULTS_TTL (backstop) |
| `taken`             | list       | the trainer's ingest thread moves results here from `results`, and trims them once taken in (rlfarm.trainer.ingest) | RESULTS_TTL (backstop) |
| `lease:<task>`      | string     | the worker running the task (the node renews it with PEXPIRE only) | lease seconds, renewed |
| `attempts:<id>`     | string     | the worker delivered a task message         | RESULTS_TTL            |
| `stream:<sha256>`   | string     | the worker of a "continue" task, with its result: the env stream's snapshot (rlfarm.core.streams); the trainer deletes it once superseded | STREAM_TTL |

| `share`             | hash       | trainer (weight, demand, cap, busy seconds: rlfarm.farm.shares) | refreshed 4x a second |

`rlfarm checkpoints delete` removes every key under the prefix (`run_pattern`).

Two keys belong to the farm rather than a run (a run id cannot hold '@'):

| key                 | type       | written by                                  | expiry                 |
| ------------------- | ---------- | ------------------------------------------- | ---------------------- |
| `rlfarm:@farm:runs` | sorted set | trainers: run id, scored by when its registration lapses (Redis TIME) | members past their score are removed |
| `rlfarm:@farm:nodes`| sorted set | workers' main processes: `<slots>@<node>`, scored likewise | likewise |
"""

from __future__ import annotations

NAMESPACE = "rlfarm"
# Backstop expiries: the trainer pops results as they come and deletes what it owns at the end; these
# only bound what a dead trainer leaves behind.
RESULTS_TTL = 3600
# A stream's snapshot waits for the stream's next task (seconds, unless the trainer is stopped): a
# trainer resumed within this long goes on with its streams, later ones restart them from new seeds.
STREAM_TTL = 6 * 3600
STATUS_TTL = 120  # seconds: a trainer that stops writing drops out of `rlfarm status` by itself
CLAIM_SECONDS = 15.0  # a dead trainer's tasks stop running and its run id is free this long after it died
LIVE = "*"  # member of `wanted` while the run's trainer lives (not a task key: those hold ':')
META_PATTERN = f"{NAMESPACE}:*:meta"  # one per run: how runs are listed
RUNS = f"{NAMESPACE}:@farm:runs"  # runs training now, for fair shares (rlfarm.farm.shares)
NODES = f"{NAMESPACE}:@farm:nodes"  # rlfarm workers alive now and their slots


# The Redis type of every key above, by the name after `rlfarm:<run>:` (its first part): what a trainer
# expects to find when it reads or writes one. A key of another type was written by someone else (a
# run's keys are written only by its trainer and workers): rlfarm.farm.guard deletes it and the
# trainer writes its own again.
TYPES = {
    "meta": "string",
    "policy": "string",
    "versions": "zset",
    "pinned": "set",
    "trainer": "string",
    "status": "hash",
    "share": "hash",
    "wanted": "set",
    "results": "list",
    "taken": "list",
    "lease": "string",
    "attempts": "string",
    "stream": "string",
}
FARM_TYPES = {RUNS: "zset", NODES: "zset"}


def expected_type(key: bytes | str) -> str | None:
    """The Redis type `key` must have (`TYPES`, `FARM_TYPES`); None for a key rlfarm does not know."""
    text = key.decode(errors="replace") if isinstance(key, bytes) else key
    if text in FARM_TYPES:
        return FARM_TYPES[text]
    parts = text.split(":", 3)
    if len(parts) < 3 or parts[0] != NAMESPACE:
        return None
    return TYPES.get(parts[2].split("@", 1)[0])  # `policy@<p>`: a policy's own line (`line`)


def prefix(run: str) -> str:
    return f"{NAMESPACE}:{run}:"


def run_of(key: bytes | str) -> str:
    """The run id in one of its keys (`rlfarm:<run>:meta` -> run)."""
    text = key.decode() if isinstance(key, bytes) else key
    return text.split(":", 2)[1]


def meta(run: str) -> str:
    return f"{prefix(run)}meta"


def _line(line: str | None) -> str:
    """The suffix of a policy's own version line's keys (policy names are identifiers: no ':' or '@')."""
    return "" if line is None else f"@{line}"


def policy(run: str, version: int, line: str | None = None) -> str:
    return f"{prefix(run)}policy{_line(line)}:{version}"


def latest(run: str, line: str | None = None) -> str:
    return f"{prefix(run)}policy{_line(line)}:latest"


def versions(run: str, line: str | None = None) -> str:
    return f"{prefix(run)}versions{_line(line)}"


def pinned(run: str, line: str | None = None) -> str:
    return f"{prefix(run)}pinned{_line(line)}"


def claim(run: str) -> str:
    return f"{prefix(run)}trainer"


def status(run: str) -> str:
    return f"{prefix(run)}status"


def share(run: str) -> str:
    return f"{prefix(run)}share"


def wanted(run: str) -> str:
    return f"{prefix(run)}wanted"


def results(run: str) -> str:
    return f"{prefix(run)}results"


def taken(run: str) -> str:
    """Results the trainer's ingest thread took out of `results` and is decoding (rlfarm.trainer.ingest)."""
    return f"{prefix(run)}taken"


def task(kind: str, iteration: int, index: int) -> str:
    """A task's key text (`rollout:3:0`), as `wanted` lists it and its lease is named."""
    return f"{kind}:{iteration}:{index}"


def lease(run: str, task_text: str) -> str:
    return f"{prefix(run)}lease:{task_text}"


def attempts(run: str, task_id: str) -> str:
    return f"{prefix(run)}attempts:{task_id}"


def stream(run: str, digest: str) -> str:
    """An env stream's snapshot, named by its sha256 (rlfarm.core.streams)."""
    return f"{prefix(run)}stream:{digest}"


def _glob_escape(text: str) -> str:
    """`text` as a literal inside a SCAN MATCH pattern (a run id '*' must not match every run)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def run_pattern(run: str) -> str:
    """A SCAN MATCH pattern for every key of `run` and no other run's."""
    return _glob_escape(prefix(run)) + "*"

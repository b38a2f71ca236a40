"""Counts a worker's pool processes keep for its main process, which exports them
(`rlfarm worker --metrics-port`, rlfarm.runio.exporter): tasks run, policy versions fetched and
their bytes, Redis outages ridden out.

The pool processes are forked from the main process, so shared memory the main process maps before
its pool starts is theirs too. Each process owns one row and stores its own running totals in it:
a store into its own cells, never a read-modify-write of a shared one, so there is no lock that a
process SIGKILLed mid-write (a time limit, a hung env) could leave held. The main process adds the
rows up. A dead process's row keeps its last totals, so sums never go down (Prometheus counters);
a row is never handed to another process, even one that gets a dead process's pid.
"""

from __future__ import annotations

import os
from multiprocessing.sharedctypes import RawArray

FIELDS = ("tasks", "policy_fetches", "policy_fetch_bytes", "redis_outages")
ROWS = 1024  # pool processes over a worker's life (replaced ones included) whose counts are kept


def current_pid() -> int:
    return os.getpid()


class NodeCounters:
    def __init__(self, rows: int = ROWS):
        self.pids = RawArray("q", rows)  # the process owning each row (0: free)
        self.cells = RawArray("q", rows * len(FIELDS))
        self._row: int | None = None
        self._row_pid = 0  # the process `_row` was claimed by (a forked child inherits the attribute)

    def _own_row(self) -> int | None:
        pid = current_pid()
        if self._row_pid == pid:
            return self._row
        rows = len(self.pids)
        row = None
        for probe in range(rows):
            i = (pid + probe) % rows
            if self.pids[i] == 0:
                self.pids[i] = pid
                # Two processes claiming one free row at once: the later store wins, the other moves on.
                if self.pids[i] == pid:
                    row = i
                    break
        self._row, self._row_pid = row, pid
        return row

    def store(self, **totals: int) -> None:
        """This process's running totals (FIELDS), replacing what it stored before."""
        row = self._own_row()
        if row is None:  # every row taken: this process's counts go unreported
            return
        base = row * len(FIELDS)
        for name, value in totals.items():
            self.cells[base + FIELDS.index(name)] = int(value)

    def totals(self) -> dict[str, int]:
        """Every process's totals added up, by field."""
        width = len(FIELDS)
        cells = self.cells[:]
        return {name: sum(cells[i::width]) for i, name in enumerate(FIELDS)}

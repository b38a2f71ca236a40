"""A worker process's cache of the policies it acts with (rlfarm.worker.policies)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class PolicyCache:
    """Per-process LRU of decoded policies keyed by (run, version): a version is fetched once."""

    def __init__(self, size: int = 4):
        self.size = size
        self._items: OrderedDict[tuple[str, int], Any] = OrderedDict()

    def get(self, key: tuple[str, int]) -> Any | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, key: tuple[str, int], value: Any) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def drop_run(self, run: str, lines: bool = False) -> None:
        """Forget every version of `run` (a new trainer of that run id: rlfarm.farm.claim); `lines`:
        keys are `run@policy` (each policy's own line)."""
        for key in [k for k in self._items if k[0] == run or (lines and k[0].startswith(f"{run}@"))]:
            del self._items[key]

    def __len__(self) -> int:
        return len(self._items)

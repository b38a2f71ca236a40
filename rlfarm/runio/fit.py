"""What the console shows, fitted to its width (80 columns included): compact numbers, short ages,
a line of cells and a table whose least needed parts are left out rather than cut.

rich shrinks what does not fit by cutting it (`40…`, `runni…`): a cut step count or run id reads as
another value, so here whole cells or columns go instead, in the order the caller ranks them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

_UNITS = ((10**9, "G"), (10**6, "M"), (10**3, "k"))
_WIDE = 10_000  # the width a renderable is measured at to know its natural (unwrapped) width


def count(n: float) -> str:
    """40960 -> 40.9k, 100000 -> 100k, 1234567 -> 1.23M: at most three significant digits, rounded
    down, so a bar never shows its total before it is reached."""
    n = int(n)
    if abs(n) < 1000:
        return str(n)
    scale, unit = next((s, u) for s, u in _UNITS if abs(n) >= s)
    whole = abs(n) // scale
    digits = 2 if whole < 10 else 1 if whole < 100 else 0
    q = abs(n) * 10**digits // scale  # integers: 4100 is 4.1k, not 4.09k through float rounding
    text = str(q) if not digits else f"{q // 10**digits}.{q % 10**digits:0{digits}d}".rstrip("0").rstrip(".")
    return f"{'-' if n < 0 else ''}{text}{unit}"


def age(seconds: float | None) -> str:
    """A duration in at most 5 characters: 2.2s, 42s, 2m05s, 2h01m, 2d07h (`-` when unknown)."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


class Line:
    """Cells on one line, `gap` spaces apart. `cells`: (rank, Text) in display order, rank 0 always kept;
    when the line is too wide the highest rank goes first (of equal ranks, the rightmost). `bar`:
    (index, rank, min_width, max_width, make(width)): a flexible cell at `index` that takes the width
    left, between its bounds."""

    def __init__(
        self,
        cells: Sequence[tuple[int, Text]],
        bar: tuple[int, int, int, int, Callable[[int], Any]] | None = None,
        gap: int = 1,
    ):
        self.cells = list(cells)
        self.bar = bar
        self.gap = gap

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        kept = list(range(len(self.cells)))
        bar_rank = self.bar[1] if self.bar else -1
        has_bar = self.bar is not None

        def needed() -> int:
            parts = [self.cells[i][1].cell_len for i in kept] + ([self.bar[2]] if has_bar else [])  # type: ignore[index]
            return sum(parts) + self.gap * max(0, len(parts) - 1)

        while needed() > width:
            ranked = [(self.cells[i][0], pos, i) for pos, i in enumerate(kept) if self.cells[i][0] > 0]
            top = max(ranked, default=None)
            if has_bar and bar_rank > 0 and (top is None or bar_rank > top[0]):
                has_bar = False
            elif top is not None:
                kept.remove(top[2])
            else:
                break  # only the essential cells are left: rich wraps what still does not fit
        row: list[Any] = [self.cells[i][1] for i in kept]
        if has_bar and self.bar is not None:
            index, _, low, high, make = self.bar
            spare = width - needed() + low
            at = sum(1 for i in kept if i < index)
            row.insert(at, make(max(low, min(high, spare))))
        table = Table.grid(*(Column(no_wrap=True) for _ in row), padding=(0, self.gap))
        table.add_row(*row)
        yield table


class FitTable:
    """A table built by `make(columns)` with the columns that fit: while its natural width is more
    than the width given, the next of `drop` (column names, first dropped first) is left out. A
    table still too wide once `drop` is spent is rendered as rich renders it (wrapping its cells)."""

    def __init__(self, make: Callable[[list[str]], Table], columns: Sequence[str], drop: Sequence[str]):
        self.make, self.columns, self.drop = make, list(columns), list(drop)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        columns, drop = list(self.columns), list(self.drop)
        table = self.make(columns)
        while drop and natural_width(console, options, table) > options.max_width:
            columns.remove(drop.pop(0))
            table = self.make(columns)
        yield table

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, options.max_width)


def natural_width(console: Console, options: ConsoleOptions, renderable: Any) -> int:
    """The width `renderable` takes when nothing limits it (no cell wrapped)."""
    return Measurement.get(console, options.update_width(_WIDE), renderable).maximum

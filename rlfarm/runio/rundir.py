"""Writing into a run directory so that a full disk or a directory made read-only costs one line and
nothing already written: files are replaced whole or not at all, CSV rows are appended whole or not
at all, and every failure is a RunDirError naming the path and the error.

A torn file would be worse than a missing one: `rlfarm train --resume` reads the checkpoint and cuts
the CSV files back to the checkpoint's step, and a half row there is a row of garbage.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from rlfarm.errors import RunDirError


def write_atomic(path: Path | str, data: bytes | str) -> Path:
    """Replace `path` with `data` whole: written to a temporary file beside it, synced, renamed over
    it. On any error the old file is untouched, the temporary one removed, and RunDirError raised."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    blob = data.encode() if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)  # a full disk keeps the space of a half-written copy otherwise
        except OSError:
            pass
        raise RunDirError(path, exc) from None
    return path


def csv_text(rows: Iterable[Sequence[object]]) -> str:
    """Rows as CSV text (the csv module's quoting, \\r\\n line ends as csv.writer writes them)."""
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    return buffer.getvalue()


class RowFile:
    """A CSV file that only ever grows by whole rows.

    Unbuffered: each `append` is one or more write(2) calls of the rows' bytes; if any fails (ENOSPC,
    EIO, ...) the file is cut back to where it ended before, so a reader never meets half a row."""

    def __init__(self, path: Path | str, mode: str = "a"):
        """`mode`: "a" to append to what is there, "w" to start empty."""
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if mode == "w" else 0), 0o644)
        except OSError as exc:
            raise RunDirError(self.path, exc) from None

    def append(self, rows: Iterable[Sequence[object]]) -> None:
        data = csv_text(rows).encode()
        if not data:
            return
        start = os.lseek(self._fd, 0, os.SEEK_END)
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            try:
                os.ftruncate(self._fd, start)  # frees what the failed write took; needs no new space
                os.lseek(self._fd, start, os.SEEK_SET)
            except OSError:
                pass
            raise RunDirError(self.path, exc) from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_whole_rows(path: Path) -> list[list[str]]:
    """The rows of a CSV file, less a last line without its line end (a file written before rows were
    appended whole, cut by a crash or a full disk)."""
    with open(path, newline="") as f:
        text = f.read()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return list(csv.reader(io.StringIO(text, newline="")))

"""rlfarm's own messages: stdlib `logging` under the "rlfarm" logger, on the console through rich's
handler and in the run directory.

- `setup_logging(verbosity)` (the `rlfarm` command group calls it: `-q` is -1, `-v` is 1) puts one
  console handler on the "rlfarm" logger. Each record is exactly one line on stderr, never wrapped
  (users and tests grep for them): `rlfarm: warning: ...`, `rlfarm: error: ...`, `rlfarm: ...` (info),
  `rlfarm: debug: ...`. -1 shows warnings and errors only, 0 adds info, 1 or more adds debug.
- `log_to_file(run_dir)` adds RUN_DIR/rlfarm.log (plain text, one timestamped line per record, never
  wrapped) to the same logger, at info (debug with `-v`) whatever the console shows; `remove(handler)`
  takes it off; `log_fatal(run_dir, line)` adds the error line the run ended with, after that. What
  was logged before the run log opened (config warnings, the farm found: the run directory did not
  exist yet) is kept since `setup_logging` and written at its top, with its own time.
- While a run's live progress bar is on the terminal (`set_live_console`), console lines are printed
  through the bar's console, so they appear above the bar instead of breaking it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import deque
from pathlib import Path

from rich.console import Console, ConsoleRenderable
from rich.logging import RichHandler
from rich.text import Text

LOGGER = "rlfarm"
LOG_FILE = "rlfarm.log"
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_PREFIXES = {
    logging.DEBUG: ("rlfarm: debug: ", "dim"),
    logging.INFO: ("rlfarm: ", ""),
    logging.WARNING: ("rlfarm: warning: ", "yellow"),
    logging.ERROR: ("rlfarm: error: ", "red"),
}

EARLY_RECORDS = 200  # records kept for the next run log (a long-lived process keeps its last ones)

_live_console: Console | None = None
_verbosity = 0
_run_logs: set[Path] = set()  # the rlfarm.log files this process has written a run's records to
_open_run_logs: set[logging.Handler] = set()  # run logs attached now


def level_for(verbosity: int) -> int:
    """The console's level for a verbosity: -1 (or less) warnings, 0 info, 1 (or more) debug."""
    return logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG


def verbosity() -> int:
    """What the last `setup_logging` was given (0 if it was never called)."""
    return _verbosity


class ConsoleHandler(RichHandler):
    """rich's handler without its columns: one line per record, on stderr; above the live progress bar
    while there is one on the same terminal. A record stays one line in a pipe or file (lines are
    grepped and copied); on a terminal it wraps between words (the terminal cut words in two)."""

    def __init__(self, level: int = logging.INFO):
        stderr = Console(stderr=True, soft_wrap=True)
        super().__init__(
            level=level,
            console=stderr,
            show_time=False,
            show_level=False,
            show_path=False,
            markup=False,
            keywords=[],
            rich_tracebacks=False,
        )
        self._stderr = stderr

    def render(
        self, *, record: logging.LogRecord, traceback: object, message_renderable: ConsoleRenderable
    ) -> ConsoleRenderable:
        level = max((lv for lv in _PREFIXES if lv <= record.levelno), default=logging.DEBUG)
        prefix, style = _PREFIXES[level]
        return Text.assemble((prefix, style), message_renderable)  # type: ignore[arg-type]

    def emit(self, record: logging.LogRecord) -> None:
        live = _live_console
        on_bar = live is not None and live.is_terminal and self._stderr.is_terminal
        console = live if on_bar else self._stderr
        try:
            line = self.render(
                record=record, traceback=None, message_renderable=self.render_message(record, self.format(record))
            )
            console.print(line, soft_wrap=not console.is_terminal)
        except Exception:  # noqa: BLE001 - logging's contract: a handler never raises
            self.handleError(record)


class _EarlyRecords(logging.Handler):
    """Records made while no run log is open, for the next one to start with: a run's start-up
    warnings come before its directory exists, and its rlfarm.log is what is kept of it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: deque[logging.LogRecord] = deque(maxlen=EARLY_RECORDS)

    def emit(self, record: logging.LogRecord) -> None:
        if not _open_run_logs:
            self.records.append(record)


def setup_logging(verbosity: int = 0) -> logging.Handler:
    """The console handler of the "rlfarm" logger (replacing one set up before)."""
    global _verbosity
    _verbosity = verbosity
    logger = logging.getLogger(LOGGER)
    for old in [h for h in logger.handlers if isinstance(h, ConsoleHandler | _EarlyRecords)]:
        logger.removeHandler(old)
    level = level_for(verbosity)
    handler = ConsoleHandler(level)
    logger.addHandler(handler)
    logger.addHandler(_EarlyRecords())  # a fresh start: only this command's records
    # Records are made down to info even with -q: the run's log file keeps them.
    logger.setLevel(min(level, logging.INFO))
    return handler


def hand_over_to_celery() -> None:
    """In `rlfarm worker`: Celery's logging (its --loglevel, its format, its log file) takes over
    rlfarm's records, as for `celery -A tasks worker`."""
    logger = logging.getLogger(LOGGER)
    for old in [h for h in logger.handlers if isinstance(h, ConsoleHandler | _EarlyRecords)]:
        logger.removeHandler(old)
    logger.setLevel(logging.NOTSET)


class _RunFileHandler(logging.FileHandler):
    """Opened at the first record (a run that fails before it logs anything leaves no file), making
    the run directory if need be."""

    def __init__(self, path: Path):
        super().__init__(path, encoding="utf-8", delay=True)

    failed = False  # it could not write: a full disk or a read-only directory

    def _open(self):  # noqa: ANN202 - logging.FileHandler's own hook
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """Once, a warning line instead of logging's traceback per record; the console still has it all."""
        if self.failed:
            return
        self.failed = True
        exc = sys.exc_info()[1]
        reason = getattr(exc, "strerror", None) or exc
        logging.getLogger(LOGGER).warning(
            "cannot write %s (%s): the run's messages go to the console only", self.baseFilename, reason
        )

    def close(self) -> None:
        try:
            super().close()
        except OSError:  # the buffered end of a file it could not write: already said
            pass


def log_to_file(run_dir: str | Path) -> logging.Handler:
    """Append the "rlfarm" logger's records to RUN_DIR/rlfarm.log until `remove(handler)`.

    Used as a library, with no logging set up at all, rlfarm also gets its console handler here, so
    a run's warnings still reach stderr as `rlfarm: warning:` lines."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(h, ConsoleHandler) for h in logger.handlers) and not logging.getLogger().handlers:
        setup_logging(0)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    handler = _RunFileHandler(Path(run_dir) / LOG_FILE)
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    for early in [h for h in logger.handlers if isinstance(h, _EarlyRecords)]:
        while early.records:  # in the order made, each with the time it was made
            handler.handle(early.records.popleft())
    logger.addHandler(handler)
    _open_run_logs.add(handler)
    _run_logs.add(Path(handler.baseFilename))
    return handler


def log_fatal(run_dir: str | Path, message: str, name: str = "rlfarm.cli") -> None:
    """Append the error line a run ended with to RUN_DIR/rlfarm.log, which the run's own handler
    has closed by the time the CLI turns the exception into that line: the log is what is kept.
    Only a log this process wrote (a second trainer refused at start must not write into the log of
    the run it collided with); nothing when it cannot write (the console has the line)."""
    path = Path(os.path.abspath(Path(run_dir) / LOG_FILE))  # as logging.FileHandler names it
    if path not in _run_logs:
        return
    record = logging.LogRecord(name, logging.ERROR, __file__, 0, message, None, None)
    try:
        with path.open("a", encoding="utf-8") as file:
            file.write(logging.Formatter(FILE_FORMAT).format(record) + "\n")
    except OSError:
        pass


def remove(handler: logging.Handler | None) -> None:
    """Take a handler from `log_to_file` off the "rlfarm" logger and close its file."""
    if handler is not None:
        logging.getLogger(LOGGER).removeHandler(handler)
        _open_run_logs.discard(handler)
        handler.close()


def set_live_console(console: Console | None) -> None:
    """The console of the live progress bar now on screen (None: none any more)."""
    global _live_console
    _live_console = console

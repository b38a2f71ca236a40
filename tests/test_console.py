"""What a run says and where: rlfarm.runio.logs (one-line console messages, -q/-v, RUN_DIR/rlfarm.log), the
progress bar's evaluation field and ETA, the worker's no-password warning, and the one-line errors of
an install without the `train` extra."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

from rlfarm.errors import ConfigError
from rlfarm.farm.connection import is_loopback, no_password_warning
from rlfarm.observe.metrics import EVAL_LINE_EVERY, RunLogger, summary_writer_class
from rlfarm.runio import logs

from .conftest import ROOT, WORKER_ENV, one_error_line, run_cli


@pytest.fixture
def rlfarm_logger():
    """The "rlfarm" logger as a test found it, restored afterwards (handlers and level)."""
    logger = logging.getLogger(logs.LOGGER)
    handlers, level = list(logger.handlers), logger.level
    yield logger
    for handler in list(logger.handlers):
        if handler not in handlers:
            logger.removeHandler(handler)
            handler.close()
    logger.setLevel(level)


def test_console_lines_are_one_line_each_with_their_prefix(rlfarm_logger, capsys):
    log = logging.getLogger("rlfarm.trainer")
    logs.setup_logging(0)
    long = "lost Redis at redis://10.0.0.5:6379/0 (ConnectionError: [Errno 111] refused); " + "x" * 200
    log.warning("%s", long)
    log.info("target return %g reached after %d env steps", 1.0, 1024)
    log.debug("not at the default verbosity")
    assert capsys.readouterr().err.splitlines() == [
        f"rlfarm: warning: {long}",
        "rlfarm: target return 1 reached after 1024 env steps",
    ]
    logs.setup_logging(-1)  # -q: warnings and errors only
    log.info("hidden")
    log.warning("shown")
    logs.setup_logging(1)  # -v: debug too; the handler replaces the previous one (not added twice)
    log.debug("debug %d", 3)
    assert capsys.readouterr().err.splitlines() == ["rlfarm: warning: shown", "rlfarm: debug: debug 3"]
    assert sum(isinstance(h, logs.ConsoleHandler) for h in rlfarm_logger.handlers) == 1


def test_the_run_log_keeps_info_lines_whatever_the_console_shows(rlfarm_logger, tmp_path, capsys):
    logs.setup_logging(-1)
    run_dir = tmp_path / "run"
    handler = logs.log_to_file(run_dir)
    assert not run_dir.exists()  # nothing logged yet: no file (a run that fails at once leaves none)
    log = logging.getLogger("rlfarm.trainer")
    log.info("resuming run r from its checkpoint")
    log.warning("a warning")
    log.debug("debug only with -v")
    logs.remove(handler)
    log.info("after the run")
    lines = (run_dir / logs.LOG_FILE).read_text().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(" INFO rlfarm.trainer: resuming run r from its checkpoint")
    assert lines[1].endswith(" WARNING rlfarm.trainer: a warning")
    assert lines[0][:4].isdigit() and lines[0][4] == "-"  # 2026-... timestamp
    assert capsys.readouterr().err.splitlines() == ["rlfarm: warning: a warning"]


def _logger(tmp_path, **kwargs) -> RunLogger:
    console = Console(file=io.StringIO(), force_terminal=False, width=200)
    return RunLogger(tmp_path, {"algo": "ppo"}, 100_000, console, tensorboard=False, **kwargs)


def test_evaluations_go_on_the_bar_and_every_tenth_and_the_last_on_the_console(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="rlfarm")
    logger = _logger(tmp_path)
    for i in range(1, 26):
        logger.evaluation(1000 * i, [float(i), float(i)], i)
    assert logger.progress.tasks[0].fields["eval"] == "eval 25.0 (best 25.0)"
    logger.evaluation(26_000, [3.0, 5.0], 26)
    assert logger.progress.tasks[0].fields["eval"] == "eval 4.0 (best 25.0)"
    logger.close()
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert [m.split(" at step")[0] for m in info] == ["eval 10", "eval 20", "eval 26"]  # 26: the last
    assert info[-1] == ("eval 26 at step 26000 (policy v26): mean return 4.0 ± 1.0 over 2 greedy episodes (best 25.0)")
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and r.name == "rlfarm.metrics"]
    assert len(debug) == 26 - 2  # the others: shown with -v
    assert EVAL_LINE_EVERY == 10
    assert len((tmp_path / "evals.csv").read_text().splitlines()) == 1 + 26  # all of them


def test_a_run_that_fails_does_not_repeat_its_last_evaluation(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="rlfarm")
    logger = _logger(tmp_path)
    logger.evaluation(1000, [1.0], 1)
    try:
        try:
            raise RuntimeError("the run failed")
        finally:
            logger.close()  # as Trainer.train's finally calls it
    except RuntimeError:
        pass
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_plain_status_lines_have_an_eta_and_the_evaluation(tmp_path):
    logger = _logger(tmp_path)
    logger.status(1000, 500.0, 1, 2)
    logger.evaluation(1000, [487.25, 487.35], 1)
    logger._last_line = 0.0  # the next status prints a line now (one every 5 s otherwise)
    logger.status(2000, 500.0, 2, 2)  # a second sample: rich has a speed, so an ETA
    logger.close()
    first, second = logger.console.file.getvalue().splitlines()
    assert first.startswith("step 1000/100000  ETA -  SPS 500")
    assert second.startswith("step 2000/100000  ETA ")
    eta = second.split("ETA ")[1].split()[0]
    assert eta != "-" and eta.count(":") == 2, second  # H:MM:SS
    assert "eval 487.3 (best 487.3)" in second


def test_a_resumed_logger_keeps_its_evaluations_and_starts_its_bar_at_its_step(tmp_path):
    logger = _logger(tmp_path)
    logger.evaluation(1000, [7.0], 1)
    state = logger.state(30_000)
    logger.close()
    resumed = _logger(tmp_path, resume=state)
    assert resumed.progress.tasks[0].completed == 30_000  # the ETA's speed starts from there
    assert resumed.progress.tasks[0].fields["eval"] == "eval 7.0 (best 7.0)"
    old = {k: v for k, v in state.items() if k not in ("evaluations", "best_eval", "last_eval")}
    resumed.close()
    assert _logger(tmp_path, resume=old).progress.tasks[0].fields["eval"] == ""  # an older checkpoint


@pytest.mark.parametrize(
    "url, warned",
    [
        ("redis://127.0.0.1:6379/0", False),
        ("redis://127.3.2.1/0", False),
        ("redis://localhost:6379/0", False),
        ("redis://LocalHost./0", False),
        ("redis://[::1]:6379/0", False),
        ("redis://[::ffff:127.0.0.1]/0", False),
        ("unix:///run/redis.sock", False),
        ("redis://:secret@10.0.0.5:6379/0", False),
        ("rediss://user:secret@redis-host:6380/0", False),
        ("redis://10.0.0.5:6379/0", True),
        ("redis://trainer-host:6379/0", True),
        ("redis://[2001:db8::1]/0", True),
        ("rediss://user@redis-host:6380/0", True),
        ("redis://:@10.0.0.5/0", True),
        ("redis://0.0.0.0/0", True),
    ],
)
def test_worker_warns_of_a_redis_without_password_off_this_machine(url, warned):
    text = no_password_warning(url)
    assert (text is not None) == warned
    if warned:
        assert "without a password" in text and "secret" not in text


def test_loopback_names():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("128.0.0.1")
    assert not is_loopback("") and not is_loopback(None) and not is_loopback("localhost.example.com")


# ---- an install without the `train` extra (pip install rlfarm: a worker's) ----------------------------
def test_missing_tensorboard_is_a_config_error_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ConfigError, match=r'TensorBoard is not installed .*pip install -e "\.\[train\]"'):
        summary_writer_class()
    with pytest.raises(ConfigError):
        RunLogger(tmp_path / "run", {}, 10)
    assert not (tmp_path / "run").exists()


def _without(module: str, *args: str) -> subprocess.CompletedProcess:
    """`rlfarm ARGS` in a process where `import MODULE` fails, as on an install without it."""
    code = f"import sys; sys.modules[{module!r}] = None; from cli import main; main(prog_name='rlfarm')"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **WORKER_ENV},
        timeout=600,
    )


@pytest.mark.process
def test_plot_without_matplotlib_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"env": {"id": "CartPole-v1"}, "algo": "ppo", "run_id": "r"}')
    (tmp_path / "episodes.csv").write_text(
        "global_step,wall_time,episodic_return,episodic_length,policy_version\n10,0.5,10.0,10,0\n"
    )
    result = _without("matplotlib", "plot", str(tmp_path))
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "rlfarm plot needs matplotlib" in line and 'pip install -e ".[train]"' in line


def test_train_without_tensorboard_is_one_line_and_leaves_no_run(farm, tmp_path):
    result = _without(
        "tensorboard", "train", "--redis", farm.redis_url, "--run-id", "no-tb", "--logdir", str(tmp_path), *SHORT
    )
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "TensorBoard is not installed" in line and 'pip install -e ".[train]"' in line
    assert not (tmp_path / "no-tb" / "config.json").exists()  # the same --run-id can start once installed


# ---- rlfarm -q / -v train, end to end ------------------------------------------------------------------
SHORT = [
    "--total-steps",
    "2048",
    "--set",
    "farm.num_tasks=2",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.steps_per_env=512",
    "--set",
    "ppo.num_minibatches=2",
]  # 2 iterations of 1024 steps
EVALS = ["--set", "eval.interval=1024", "--set", "eval.episodes=2", "--set", "eval.tasks=1"]


def _train(farm, tmp_path, run_id: str, *args: str) -> subprocess.CompletedProcess:
    global_opts = [a for a in args if a in ("-q", "-v")]
    rest = [a for a in args if a not in ("-q", "-v")]
    result = run_cli(
        *global_opts, "train", "--redis", farm.redis_url, "--run-id", run_id, "--logdir", str(tmp_path), *SHORT, *rest
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_quiet_train_prints_no_info_lines_and_its_run_log_has_them(farm, tmp_path):
    # eval.interval = 0: the target is the rolling training return's; a random policy's ~20 >= 1.
    rolling = ["--target-return", "1", "--set", "eval.interval=0"]
    quiet = _train(farm, tmp_path, "quiet", "-q", *rolling)
    assert quiet.stderr == ""
    assert "target return" not in quiet.stdout
    log = (tmp_path / "quiet" / "rlfarm.log").read_text()
    assert " INFO rlfarm.trainer: target return 1 reached after 1024 env steps" in log

    loud = _train(farm, tmp_path, "loud", *rolling)
    lines = loud.stderr.splitlines()
    assert lines[0] == "rlfarm: target return 1 reached after 1024 env steps"
    assert len(lines) == 2 and lines[1].startswith("rlfarm: eval 1 at step 1024 (policy v1): ")  # the final policy's
    [best] = [line for line in loud.stdout.splitlines() if line.startswith("best policy: v")]
    assert best.endswith("(best_policy.safetensors); target 1 reached"), best


def test_evaluation_lines_at_the_default_verbosity_and_with_v(farm, tmp_path):
    default = _train(farm, tmp_path, "evals", *EVALS)  # evaluations 1 (at 1024) and 2 (the final policy)
    lines = default.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlfarm: eval 2 at step 2048 (policy v2): mean return ")
    assert "eval 1 at" not in (tmp_path / "evals" / "rlfarm.log").read_text()

    verbose = _train(farm, tmp_path, "evals-v", "-v", *EVALS)
    lines = verbose.stderr.splitlines()
    assert lines[0].startswith("rlfarm: debug: eval 1 at step 1024 (policy v1): mean return "), lines
    assert lines[-1].startswith("rlfarm: eval 2 at step 2048"), lines
    assert " DEBUG rlfarm.metrics: eval 1 at step 1024" in (tmp_path / "evals-v" / "rlfarm.log").read_text()


def test_progress_has_one_row_per_step_across_a_resume(tmp_path):
    """A resumed run's first log before any new step, and a run's closing log right after a periodic
    one, repeated the row of that step in progress.csv (the curves then had two points at one step)."""
    logger = _logger(tmp_path)
    for step in (1000, 2000, 2000):  # the closing log at the step of the last periodic one
        logger.scalars(step, {"losses/loss": 1.0})
    state = logger.state(2000)
    logger.close()
    resumed = _logger(tmp_path, resume=state)
    for step in (2000, 3000):  # logged once more at the checkpoint's step before new results arrive
        resumed.scalars(step, {"losses/loss": 1.0})
    resumed.close()
    rows = (tmp_path / "progress.csv").read_text().splitlines()
    assert [int(r.split(",")[0]) for r in rows[1:]] == [1000, 2000, 3000]


# ---- 80 columns: the progress display and files never cut or wrap what they show -----------------
def test_compact_counts_and_ages():
    from rlfarm.runio import fit

    assert [
        fit.count(n)
        for n in (0, 999, 1000, 4100, 20480, 40960, 100_000, 999_999, 1_000_000, 1_234_567, 10_000_384, 2.5e9, -40960)
    ] == ["0", "999", "1k", "4.1k", "20.4k", "40.9k", "100k", "999k", "1M", "1.23M", "10M", "2.5G", "-40.9k"]
    assert [fit.age(s) for s in (None, 2.25, 42, 125, 7300, 200000)] == [
        "-",
        "2.2s",
        "42s",
        "2m05s",
        "2h01m",
        "2d07h",
    ]


def _rendered(renderable, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


@pytest.mark.parametrize(
    "total, step, shown", [(100_000, 40_960, "40.9k/100k steps"), (10_000_384, 5_123_456, "5.12M/10M steps")]
)
def test_the_progress_display_shows_steps_time_and_eta_whole_at_80_and_60_columns(tmp_path, total, step, shown):
    console = Console(file=io.StringIO(), force_terminal=False, width=80)
    logger = RunLogger(tmp_path, {"algo": "dqn"}, total, console, tensorboard=False)
    try:
        logger.status(step // 2, 1234.5, 6, 8)
        logger.episodes(step, [194.25] * 20, [194] * 20, 12)
        logger.status(step, 1234.5, 12, 8)  # a second sample: rich has a speed, so an ETA
        logger.evaluation(step, [500.0, 500.0], 12)
        display = logger.progress.get_renderable()
        for width in (80, 60):
            text = _rendered(display, width)
            assert "…" not in text and all(len(line) <= width for line in text.splitlines()), text
            first, second = text.splitlines()
            assert shown in first and re.search(r" \d+:\d\d:\d\d ETA \d+:\d\d:\d\d", first), first
            assert "return 194.2 (exploring)" in second, second  # the training return is while exploring
        wide = _rendered(display, 80)
        assert "1.23k SPS" in wide and "eval 500.0 (best 500.0)" in wide and "policy v12" in wide, wide
        assert "━" in _rendered(display, 60)  # the bar is shorter, not gone
    finally:
        logger.close()


def test_long_lines_stay_one_line_in_files_and_wrap_between_words_on_a_terminal(rlfarm_logger, tmp_path, monkeypatch):
    """A file or pipe is 80 columns to rich: a trial's train.log and `rlfarm train > out.log` had long
    lines cut in two; they stay one line. On a terminal (the live bar's console too) a line the
    terminal wrapped cut words in two ("(2 w / orker processes", issue 51): it wraps between words."""
    long = "lost Redis at redis://10.0.0.5:6379/0 (ConnectionError: [Errno 111] refused); " + " ".join(["worker"] * 40)
    handler = logs.setup_logging(0)
    run_log = logs.log_to_file(tmp_path / "run")
    bar = Console(file=io.StringIO(), force_terminal=True, width=80, color_system=None)
    monkeypatch.setattr(handler, "_stderr", Console(file=io.StringIO(), force_terminal=True, width=80))
    logs.set_live_console(bar)  # a live progress bar: log lines go through its console
    try:
        logging.getLogger("rlfarm.trainer").warning("%s", long)
    finally:
        logs.set_live_console(None)
        logs.remove(run_log)
    shown = bar.file.getvalue().splitlines()
    assert len(shown) > 1 and all(len(line) <= 80 for line in shown), shown
    assert " ".join(line.strip() for line in shown) == f"rlfarm: warning: {long}"  # no word cut in two
    [line] = (tmp_path / "run" / logs.LOG_FILE).read_text().splitlines()
    assert line.endswith(f" WARNING rlfarm.trainer: {long}")

    plain = Console(file=io.StringIO(), force_terminal=False, width=80)  # `rlfarm train > out.log`
    logger = RunLogger(tmp_path / "plain", {"algo": "ppo"}, 100_000, plain, tensorboard=False)
    logger.evaluation(1000, [487.25, 487.35], 1)
    logger.status(1000, 500.0, 1, 2)
    logger.close()
    [status] = plain.file.getvalue().splitlines()
    assert len(status) > 80 and status.startswith("step 1000/100000") and status.endswith("policy v1"), status


def test_what_was_logged_before_the_run_log_opened_is_at_its_top(rlfarm_logger, tmp_path, capsys):
    """Config warnings and the farm found come before the run directory exists: its rlfarm.log,
    what is kept of a run, starts with them (each with the time it was said)."""
    logs.setup_logging(-1)
    cli_log = logging.getLogger("rlfarm.cli")
    cli_log.warning("CartPole-v1 episodes last up to 500 steps but each task runs 64 steps per env")
    cli_log.info("no --redis given: starting an embedded Redis")
    run_log = logs.log_to_file(tmp_path / "run")
    logging.getLogger("rlfarm.trainer").info("the run's own line")
    logs.remove(run_log)
    cli_log.warning("after the run: for the next run's log, if one opens")
    lines = (tmp_path / "run" / logs.LOG_FILE).read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "WARNING rlfarm.cli: CartPole-v1 episodes last up to 500 steps but each task runs 64 steps per env",
        "INFO rlfarm.cli: no --redis given: starting an embedded Redis",
        "INFO rlfarm.trainer: the run's own line",
    ]
    second = logs.log_to_file(tmp_path / "second")
    logs.remove(second)
    assert (
        (tmp_path / "second" / logs.LOG_FILE)
        .read_text()
        .splitlines()[0]
        .endswith("after the run: for the next run's log, if one opens")
    )
    logs.setup_logging(0)  # a new command starts with nothing kept
    third = logs.log_to_file(tmp_path / "third")
    logs.remove(third)
    assert not (tmp_path / "third").exists()
    capsys.readouterr()

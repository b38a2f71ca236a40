"""The outage clock and the key guard shared by threads: the trainer's claim, share and ingest threads
use its Redis client, so one thread's recovery or repair can land in the middle of another's failure.
Each test holds one thread inside that window (its notice or its repair) and lets the other try to
run; the checks fail on the unlocked versions (a CI run's `now - None`; a command failing while
another thread repaired its key)."""

from __future__ import annotations

import threading

import redis

from rlfarm.farm.guard import GuardedRetry
from rlfarm.farm.outage import OutageRetry

# How long the thread held in the window waits for the other to get through it. With the locks the
# other cannot, so the wait runs out; without them it gets through in microseconds.
HOLD_SECONDS = 0.5


def test_a_recovery_in_another_thread_waits_for_a_failure_being_counted():
    notices: list[str] = []
    retry = OutageRetry(limit=60.0, where="Redis", max_backoff=0.0)
    recovering = threading.Thread(target=retry._recovered)

    def notify(text: str) -> None:
        notices.append(text)
        if text.startswith("still waiting"):  # inside the failure's count: another thread sees Redis back
            recovering.start()
            recovering.join(HOLD_SECONDS)

    retry.notify = notify
    retry._failed(redis.ConnectionError("Connection refused"), 1, 0.0)  # the outage starts
    retry._last_notice = float("-inf")  # the next failure says the outage goes on
    retry._failed(redis.ConnectionError("Connection refused"), 2, 0.0)  # raised `now - None` unlocked
    recovering.join()
    assert retry.outage_started is None and retry.outages == 1
    assert [text.split(" ", 2)[:2] for text in notices] == [["lost", "Redis"], ["still", "waiting"], ["Redis", "is"]]


class OneWrongKey:
    """A key guard with one wrong-typed key to delete; its repair holds the thread that runs it while
    a second thread's command fails on the same key."""

    def __init__(self, second_command):
        self.repairs = 0
        self.wrong = True
        self.second = threading.Thread(target=second_command)

    def repair(self) -> bool:
        self.repairs += 1
        if self.repairs == 1:  # the second thread's command fails before the key is deleted
            self.second.start()
            self.second.join(HOLD_SECONDS)
        found, self.wrong = self.wrong, False
        return found


def test_a_command_that_fails_while_another_thread_repairs_runs_again_once_the_repair_is_done():
    answers: list[str] = []
    failed: list[BaseException] = []
    retry = GuardedRetry(limit=60.0, where="Redis", max_backoff=0.0)

    def command() -> str:
        if guard.wrong:
            raise redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
        return "OK"

    def second_command() -> None:
        try:
            answers.append(retry.call_with_retry(command, lambda error: None))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            failed.append(exc)

    guard = OneWrongKey(second_command)
    retry.guard = guard
    first = retry.call_with_retry(command, lambda error: None)
    guard.second.join()
    assert failed == [] and answers == [first] == ["OK"]
    assert guard.repairs == 1  # the second thread found the repair done and did not repeat it

"""A task interrupted by its worker's shutdown goes back to the trainer even when the code it was in
wraps what it raises (rlfarm.worker.handler._handed_back)."""

from __future__ import annotations

from rlfarm.errors import EnvError
from rlfarm.worker.handler import HandedBack, _handed_back


def test_a_hand_back_wrapped_by_the_env_constructor_is_still_a_hand_back():
    try:
        try:
            raise HandedBack()
        except Exception as exc:  # as rlfarm.envs.make wraps any constructor's error
            raise EnvError(f"env 'x' could not be constructed: {type(exc).__name__}: {exc}") from exc
    except EnvError as wrapped:
        assert _handed_back(wrapped)
    try:
        try:
            raise HandedBack()
        except HandedBack:
            raise RuntimeError("raised while handling it") from None  # context kept, cause suppressed
    except RuntimeError as during:
        assert _handed_back(during)


def test_an_ordinary_error_is_not_a_hand_back():
    try:
        try:
            raise ValueError("bad")
        except ValueError as exc:
            raise EnvError("env 'x' could not be constructed") from exc
    except EnvError as wrapped:
        assert not _handed_back(wrapped)
    assert not _handed_back(RuntimeError("plain"))

from datetime import datetime, timedelta

import pytest

from txtasks import AckPolicy, Constant, Drop, Reject, Retry
from txtasks.policy import RetryPolicy, outcome_after_failure, outcome_for_exception, sanitized
from txtasks.types import OutcomeKind, TaskKey

NOW = datetime(2030, 1, 1, 12, 0, 0)


def policy(ack: AckPolicy = AckPolicy.RETRY) -> RetryPolicy:
    return RetryPolicy(Constant(10), ack)


def test_failure_retries_after_the_backoff_until_attempts_run_out() -> None:
    first = outcome_after_failure(TaskKey(1, 1), policy(), now=NOW, error="boom", max_attempts=3)
    assert first.kind is OutcomeKind.RETRY
    assert first.run_at == NOW + timedelta(seconds=10)
    last = outcome_after_failure(TaskKey(1, 3), policy(), now=NOW, error="boom", max_attempts=3)
    assert last.kind is OutcomeKind.DEAD
    assert "attempt 3 of 3" in (last.error or "")


def test_the_row_s_max_attempts_decides_the_last_attempt() -> None:
    outcome = outcome_after_failure(TaskKey(1, 2), policy(), now=NOW, error="x", max_attempts=2)
    assert outcome.kind is OutcomeKind.DEAD
    again = outcome_after_failure(TaskKey(1, 2), policy(), now=NOW, error="x", max_attempts=3)
    assert again.kind is OutcomeKind.RETRY


def test_deadline_stops_retries() -> None:
    outcome = outcome_after_failure(
        TaskKey(1, 1),
        policy(),
        now=NOW,
        error="x",
        max_attempts=3,
        expires_at=NOW + timedelta(seconds=5),
    )
    assert outcome.kind is OutcomeKind.DEAD
    assert "deadline" in (outcome.error or "")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (Drop("bad input"), OutcomeKind.DISCARD),
        (Reject("no way"), OutcomeKind.DEAD),
        (Retry("later", delay=1), OutcomeKind.RETRY),
        (ValueError("oops"), OutcomeKind.RETRY),
    ],
)
def test_handler_signals(exc: BaseException, kind: OutcomeKind) -> None:
    assert outcome_for_exception(TaskKey(1, 1), policy(), exc, now=NOW, max_attempts=3).kind is kind


def test_retry_delay_overrides_the_strategy() -> None:
    outcome = outcome_for_exception(
        TaskKey(1, 1), policy(), Retry(delay=2), now=NOW, max_attempts=3
    )
    assert outcome.run_at == NOW + timedelta(seconds=2)


@pytest.mark.parametrize(
    ("ack", "kind"),
    [
        (AckPolicy.DEAD_LETTER, OutcomeKind.DEAD),
        (AckPolicy.DISCARD, OutcomeKind.DISCARD),
        (AckPolicy.COMPLETE, OutcomeKind.COMPLETE),
        (AckPolicy.RETRY, OutcomeKind.RETRY),
    ],
)
def test_ack_policy_decides_other_exceptions(ack: AckPolicy, kind: OutcomeKind) -> None:
    outcome = outcome_for_exception(
        TaskKey(1, 1), policy(ack), KeyError("k"), now=NOW, max_attempts=3
    )
    assert outcome.kind is kind
    assert "KeyError" in (outcome.error or "")


INSTALLED_FILE = "/opt/app/lib/python3.11/site-packages/shop/tasks.py"


def test_error_text_names_no_file_path() -> None:
    from txtasks.policy import error_text

    try:
        compile("def broken(:\n", INSTALLED_FILE, "exec")
    except SyntaxError as exc:
        syntax = error_text(exc)
    try:
        raise ValueError("bad value")
    except ValueError as exc:
        value = error_text(exc)
    assert syntax.splitlines()[0] == "SyntaxError: invalid syntax (line 1)"
    assert value.startswith("ValueError: bad value\n  at tests.unit.test_policy.")
    assert "raise ValueError" in value
    assert "/" not in syntax + value and ".py" not in syntax + value


def _deep(n: int) -> None:
    if n:
        _deep(n - 1)
    raise KeyError("at the bottom")


def test_error_text_keeps_the_whole_traceback_and_its_causes() -> None:
    from txtasks.policy import MAX_ERROR_FRAMES, error_text

    try:
        try:
            _deep(10)
        except KeyError as low:
            try:
                raise OSError("while reporting") from None
            except OSError:
                raise RuntimeError("the handler failed") from low
    except RuntimeError as exc:
        text = error_text(exc)
    lines = text.splitlines()
    assert lines[0] == "RuntimeError: the handler failed"
    assert lines[1].startswith("  at tests.unit.test_policy.")
    cause = lines.index("caused by: KeyError: 'at the bottom'")
    frames = [line for line in lines[cause + 1 :] if line.startswith("  at ")]
    assert len(frames) == 1 + 11  # the test, then every call of _deep, innermost last
    assert frames[-1].endswith('raise KeyError("at the bottom")')
    assert "OSError" not in text  # suppressed (raised `from None` ... then handled)
    assert "/" not in text and ".py" not in text

    try:
        _deep(MAX_ERROR_FRAMES * 3)
    except KeyError as exc:
        deep = error_text(exc).splitlines()
    assert deep[1] == f"  ... {MAX_ERROR_FRAMES * 3 + 2 - MAX_ERROR_FRAMES} outer frames not kept"
    assert len(deep) == 2 + MAX_ERROR_FRAMES


def test_error_text_is_bounded_and_leaves_room_for_the_attempt() -> None:
    from txtasks.policy import MAX_ERROR_CHARS, error_text

    huge = ValueError("x" * 100_000)
    assert len(error_text(huge)) < MAX_ERROR_CHARS - 100
    outcome = outcome_for_exception(
        TaskKey(1, 3), policy(AckPolicy.RETRY), huge, now=NOW, max_attempts=3
    )
    assert len(sanitized(outcome).error or "") <= MAX_ERROR_CHARS
    assert (sanitized(outcome).error or "").endswith("(attempt 3 of 3)")

    looped = ValueError("one")
    other = ValueError("two")
    looped.__context__, other.__context__ = other, looped  # a cycle ends the chain
    assert error_text(looped).splitlines() == [
        "ValueError: one",
        "while handling: ValueError: two",
    ]

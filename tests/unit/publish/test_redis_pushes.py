"""Folding a batch's LPUSHes (``beat.publish.redis_pushes``): Redis ends the same, checked
against running each command alone on a model of Redis."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from beat.publish.redis_pushes import FOLD, Command, folded

KEYS = ["q1", "q2", "q3"]

pushes: st.SearchStrategy[Command] = st.builds(
    lambda key, values: (("LPUSH", key, *values), {}),
    st.sampled_from(KEYS),
    st.lists(st.integers(0, 10**6), min_size=1, max_size=3),
)
others: st.SearchStrategy[Command] = st.builds(
    lambda name, key: ((name, key, 60_000), {}),
    st.sampled_from(["PEXPIRE", "DEL"]),
    st.sampled_from(KEYS),
)
# Mostly pushes to one queue, as a burst is; runs long enough to cross FOLD.
commands = st.lists(st.one_of(pushes, pushes, pushes, others), max_size=60).map(
    lambda drawn: [command for command in drawn for _ in range(40)]
)


def run_on_model(stack: list[Command]) -> tuple[dict[str, list[Any]], list[Any]]:
    """Each command alone, in order, on a model of Redis lists: the lists at the end,
    and what each other command saw when it ran."""
    lists: dict[str, list[Any]] = {}
    seen: list[Any] = []
    for args, _ in stack:
        name, key = args[0], args[1]
        if name == "LPUSH":
            for value in args[2:]:
                lists.setdefault(key, []).insert(0, value)
        else:
            seen.append((args, {k: list(v) for k, v in lists.items()}))
            if name == "DEL":
                lists.pop(key, None)
    return lists, seen


@given(commands)
def test_folded_pushes_leave_redis_as_the_commands_one_by_one(stack: list[Command]) -> None:
    assert run_on_model(folded(stack)) == run_on_model(stack)


@given(commands)
def test_a_folded_push_carries_at_most_fold_messages_and_commands_only_shrink(
    stack: list[Command],
) -> None:
    result = folded(stack)
    assert len(result) <= len(stack)
    assert all(len(args) - 2 <= FOLD for args, _ in result if args[0] == "LPUSH")


def test_a_burst_to_one_queue_goes_as_one_command_per_fold() -> None:
    burst: list[Command] = [(("LPUSH", "celery", f"m{i}"), {}) for i in range(2500)]
    assert [len(args) - 2 for args, _ in folded(burst)] == [FOLD, FOLD, 500]

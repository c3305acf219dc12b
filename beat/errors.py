"""One exception tree for the whole scheduler.

Every error says what went wrong *and what to do about it* in one line, so the
CLI can print ``str(exc)`` and exit, and the beat loop can log it as is. A
class's docstring is its default message.
"""

from __future__ import annotations

#: Characters that end a line in a terminal or in ``str.splitlines``.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped (``\\n``): a message that quotes what
    someone typed stays one line, whatever they typed."""
    if not any(char in _LINE_BREAKS for char in text):
        return text
    return "".join(repr(char)[1:-1] if char in _LINE_BREAKS else char for char in text)


class HABeatError(Exception):
    """The highly-available scheduler failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(one_line(message or (self.__doc__ or "").strip()))


class ConfigError(HABeatError):
    """The configuration is invalid: check the environment variables named in
    docs/reference/configuration.md."""


class SourceError(ConfigError):
    """The schedules to import cannot be read: check the source's URL or file."""


class InvalidSchedule(HABeatError):
    """The schedule definition is invalid."""


class InvalidChannel(HABeatError):
    """A notification channel that cannot be used: its name, kind or target."""


class ChannelNotFound(HABeatError):
    """No channel has that name."""


class UnknownTask(InvalidSchedule):
    """The task is not registered with the Celery app."""


class ScheduleExists(HABeatError):
    """A schedule with this name exists already: pick another name or update it."""


class VersionConflict(HABeatError):
    """The schedule changed since the caller read it (another version): read it again,
    and make the change again on what it is now."""

    def __init__(self, message: str, *, name: str, current: str, expected: str) -> None:
        super().__init__(message)
        self.name = name
        #: The version tags (``Schedule.tag``) it has now, and the one the caller sent.
        self.current = current
        self.expected = expected


class IdempotencyKeyReused(HABeatError):
    """An idempotency key came back with another request: send a new key."""


class ScheduleNotFound(HABeatError):
    """No schedule has this name: `celery -A app schedules list` shows them."""


class StoreError(HABeatError):
    """PostgreSQL failed."""


class StoreUnavailable(StoreError):
    """PostgreSQL cannot be reached."""


class SchemaOutdated(StoreError):
    """The database schema is not the one this code expects: run `celery -A app schedules migrate`."""  # noqa: E501


class StaleEpoch(StoreError):
    """A newer leader has taken over: this process's fencing epoch is stale."""


class LeaseError(HABeatError):
    """The Redis leader lease failed."""


class LeaseUnavailable(LeaseError):
    """Redis cannot be reached."""


class DispatchError(HABeatError):
    """Publishing a run to the Celery broker failed."""


def error_text(exc: BaseException) -> str:
    """An exception as one line for people: its type and the first line of its message."""
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message.splitlines()[0]}" if message else type(exc).__name__

"""A highly-available scheduler for Celery: schedules in PostgreSQL, one leader
elected through a Redis lease fenced by an epoch that PostgreSQL checks."""

from beat.api import Schedules, define
from beat.code_schedules import periodic
from beat.errors import HABeatError
from beat.models import MisfirePolicy, RunState, Schedule, ScheduleDefinition
from beat.task import IdempotentTask

__all__ = [
    "HABeatError",
    "IdempotentTask",
    "MisfirePolicy",
    "RunState",
    "Schedule",
    "ScheduleDefinition",
    "Schedules",
    "define",
    "periodic",
]

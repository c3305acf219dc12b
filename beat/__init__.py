"""A highly-available scheduler for Celery: schedules in PostgreSQL, one leader
elected through a Redis lease fenced by an epoch that PostgreSQL checks."""

from beat.delivery.task import IdempotentTask
from beat.errors import HABeatError
from beat.models import MisfirePolicy, RunState, Schedule, ScheduleDefinition
from beat.ops.schedules import Schedules
from beat.schedule.code import periodic
from beat.schedule.define import define

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

"""Schedules and their primitives: split, reorder, vectorize, unroll, parallel."""

from compiler.errors import ScheduleError
from compiler.schedule.schedule import Schedule, Split, Stage, create_schedule

__all__ = ["Schedule", "ScheduleError", "Split", "Stage", "create_schedule"]

"""Schedules and their primitives (split, tile, fuse, reorder, annotations, placement, caches)."""

from compiler.errors import ScheduleError
from compiler.schedule.intrin import TensorIntrin, gemm_intrin
from compiler.schedule.schedule import Fuse, Schedule, Split, Stage, create_schedule

__all__ = [
    "Fuse",
    "Schedule",
    "ScheduleError",
    "Split",
    "Stage",
    "TensorIntrin",
    "create_schedule",
    "gemm_intrin",
]

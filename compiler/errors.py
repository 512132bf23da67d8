"""Errors of the compiler core.

CompilerError            any failure to turn a schedule into an artifact
├── ScheduleError        a malformed schedule request (bad axis, bad factor, bad annotation)
├── LowerError           a schedule that lowering cannot turn into a loop nest
├── CodegenError         IR that a code generator cannot render
└── BuildError           the C toolchain failed; carries the compiler's stderr
"""

from __future__ import annotations


class CompilerError(Exception):
    """Base of every error the compiler core raises on purpose."""


class ScheduleError(CompilerError):
    """A schedule primitive was asked something malformed."""


class LowerError(CompilerError):
    """Lowering cannot handle this schedule."""


class CodegenError(CompilerError):
    """A code generator cannot render this IR."""


class BuildError(CompilerError):
    """The toolchain failed to compile generated source."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(f"{message}\n{stderr}" if stderr else message)
        self.stderr = stderr

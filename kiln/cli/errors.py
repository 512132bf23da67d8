"""The one error type of the `kiln` CLI.

    CliError            printed as `kiln: <message>`; exit status `exit_code`
      exit_code 2       bad usage: a flag, a file or a shape the command cannot take
      exit_code 1       the work failed: no device, no working candidate, a store down

Library errors that a user can act on (TuningError, NoDeviceError, RecordStoreError,
TargetError) are turned into a CliError by `kiln.cli.main`: exit status 1, or 2 for a target
the device cannot run (a usage error).
"""

from __future__ import annotations


class CliError(Exception):
    """A command cannot do its work; the message says why and what to do."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    @classmethod
    def usage(cls, message: str) -> CliError:
        """Bad input on the command line (exit status 2)."""
        return cls(message, exit_code=2)

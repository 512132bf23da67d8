"""Benchmarks: scripts run as `python benchmarks/<name>.py`; a package only so mypy names them apart from the packages they measure."""

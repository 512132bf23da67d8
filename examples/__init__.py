"""Examples: scripts run as `python examples/<name>.py`; a package so tests and benchmarks import them."""

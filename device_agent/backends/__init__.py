"""Device backends, one module each, found by name: `device_agent.backends.<name>.create()`."""

from __future__ import annotations

import importlib
import re

from device_agent.backends.base import Backend

_NAME = re.compile(r"[a-z][a-z0-9_]*")
_NOT_BACKENDS = frozenset({"base", "cuda_driver", "cuda_fake"})


def get_backend(name: str) -> Backend:
    """A new instance of the backend called `name`.

    Raises:
        ValueError: no backend has that name.
    """
    if not _NAME.fullmatch(name) or name in _NOT_BACKENDS:
        raise ValueError(f"unknown backend {name!r}")
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise ValueError(f"unknown backend {name!r}") from None
    backend: Backend = module.create()
    return backend

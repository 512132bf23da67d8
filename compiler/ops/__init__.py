"""The op library: compute definitions with numpy references and tunable schedule templates."""

from __future__ import annotations

from compiler.ops.base import Template
from compiler.ops.matmul import MatmulTemplate
from compiler.ops.space import Config, ConfigSpace, Knob

_TEMPLATES: dict[str, Template] = {t.name: t for t in (MatmulTemplate(),)}

__all__ = ["Config", "ConfigSpace", "Knob", "Template", "get_template", "template_names"]


def get_template(name: str) -> Template:
    """The template registered as `name`; raises KeyError naming the known ones otherwise."""
    if name not in _TEMPLATES:
        raise KeyError(f"no op template {name!r}; known: {', '.join(sorted(_TEMPLATES))}")
    return _TEMPLATES[name]


def template_names() -> tuple[str, ...]:
    return tuple(sorted(_TEMPLATES))

"""C spellings of our dtypes and constant loop bounds: what the C and vector renderers share."""

from __future__ import annotations

from compiler.ir import expr as E

C_TYPES = {
    "float16": "_Float16",
    "float32": "float",
    "float64": "double",
    "int8": "int8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "uint8": "uint8_t",
    "uint16": "uint16_t",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "bool": "int",
}


def constant_bound(extent: E.Expr) -> int | None:
    """A constant upper bound of a loop extent, if it is a constant or min(constant, ...)."""
    if isinstance(extent, E.IntImm):
        return extent.value
    if isinstance(extent, E.Min):
        bounds = [b for b in (constant_bound(extent.a), constant_bound(extent.b)) if b is not None]
        return min(bounds) if bounds else None
    return None

"""The loop IR: expressions, statements, buffers, PrimFunc; a printer and a numpy interpreter."""

from compiler.ir.buffer import Buffer
from compiler.ir.expr import (
    LT,
    Add,
    And,
    BinaryOp,
    Expr,
    FloatImm,
    FloorDiv,
    FloorMod,
    IntImm,
    Load,
    Max,
    Min,
    Mul,
    Sub,
    Var,
    convert,
    free_vars,
)
from compiler.ir.function import PrimFunc
from compiler.ir.stmt import For, ForKind, IfThenElse, Seq, Stmt, Store, seq

__all__ = [
    "LT",
    "Add",
    "And",
    "BinaryOp",
    "Buffer",
    "Expr",
    "FloatImm",
    "FloorDiv",
    "FloorMod",
    "For",
    "ForKind",
    "IfThenElse",
    "IntImm",
    "Load",
    "Max",
    "Min",
    "Mul",
    "PrimFunc",
    "Seq",
    "Stmt",
    "Store",
    "Sub",
    "Var",
    "convert",
    "free_vars",
    "seq",
]

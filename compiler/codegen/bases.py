"""Shared base pointers: the accesses of one buffer in one C block whose indices differ only by a
constant read and write through one pointer declared at the top of the block.

An unrolled register tile indexes its buffers with the same loop terms again and again
(`A[((i * 3072) + (ko * 64)) + (k * 4) + 256]`, one per row and lane chunk); gcc parses each
sum, gimplifies it into a chain of temporaries and leaves it to its value numbering passes to
find them equal. Written once as `float *A_at = &A[((i * 3072) + (ko * 64)) + (k * 4)]` and
then read as `A_at[256]`, gcc has less to undo: on 8 random candidates per template, interleaved
(2026-11-27, x86_64-avx512), compiling took 23% less time for dense 256, 39% for Winograd, 25%
for a max pool, 15% for a 3x3 conv, and the kernels ran as fast (geomean 1.02x; outputs equal
bit for bit). gcc now sees some plain constant-trip loops (a zeroing of C) as small enough to
unroll completely, which it did not before. `--param max-completely-peel-times=1` stops that
and saves as much time again, but dense's candidates that pack A ran 0.85-0.91x (gcc no longer
unrolled the packing's row loop), so the flags stay as they were.

A block is the body of a C loop, a branch of an `if`, or the scope of an allocation. An index
is split into its terms (through + and -) and its constant; accesses whose terms match share a
group. What is rendered inside the block holds a token per access; when the block is done, the
groups used twice or more get their pointer and the other tokens become the plain `X[index]`.
An index that reads memory (a gather), or a variable not bound where the block starts, is never
grouped, nor an access C may not evaluate (an arm of `?:`, the right side of `&&` or `||`): a
pointer formed where a guard said no could point outside its buffer. Branches of an `if` are
blocks of their own, so their pointers are formed past the guard.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from compiler.ir import expr as E
from compiler.ir.buffer import Buffer

_TOKEN = re.compile("\x01(\\d+)\\.(\\d+)\x01")


@dataclass
class _Group:
    buffer: Buffer
    base: str  # C of the index's terms
    pointer: str = ""  # the pointer's name, once the block has decided to declare it


@dataclass
class _Block:
    id: int
    bound: frozenset[E.Var]
    groups: dict[tuple[Buffer, tuple[tuple[int, str], ...]], _Group] = field(default_factory=dict)
    # token number -> (group, constant part); the same access always gets the same token
    tokens: list[tuple[_Group, int]] = field(default_factory=list)
    numbers: dict[tuple[int, int], int] = field(default_factory=dict)


class BaseBlocks:
    """The blocks of one function being rendered, innermost last.

    `name(buffer)` and `expr(index term)` are the writer's; `ctype(dtype)` the C element type.
    """

    def __init__(
        self,
        name: Callable[[object], str],
        expr: Callable[[E.Expr], str],
        ctype: Callable[[str], str],
        fresh: Callable[[str], str],
    ) -> None:
        self._name, self._expr, self._ctype, self._fresh = name, expr, ctype, fresh
        self._blocks: list[_Block] = []
        self._loop_vars: list[E.Var] = []
        self._ids = itertools.count()
        self._conditional = 0  # depth of operands C may not evaluate (?: arms, && / || right sides)

    @contextlib.contextmanager
    def conditional(self) -> Iterator[None]:
        """Render operands that C evaluates only sometimes: their accesses keep plain indices,
        so no pointer is formed where they would not have run (it could point outside its
        buffer, which C leaves undefined even unread)."""
        self._conditional += 1
        try:
            yield
        finally:
            self._conditional -= 1

    def element(self, buf: Buffer, index: E.Expr, offset: int = 0) -> str:
        """C for element `index + offset` of `buf`: a token inside a block, else `X[index]`."""
        block = self._blocks[-1] if self._blocks and not self._conditional else None
        if block is None:
            return plain_element(self._name(buf), self._expr(index), offset)
        terms: list[tuple[int, E.Expr]] = []
        const = _split(index, 1, terms) + offset
        read = _plain_vars(index)
        if not terms or read is None or not read <= block.bound:
            return plain_element(self._name(buf), self._expr(index), offset)
        rendered = [(sign, self._expr(t)) for sign, t in terms]
        key = (buf, tuple(sorted(rendered)))
        group = block.groups.get(key)
        if group is None:
            group = block.groups[key] = _Group(buf, _sum(rendered))
        number = block.numbers.get((id(group), const))
        if number is None:
            number = block.numbers[(id(group), const)] = len(block.tokens)
            block.tokens.append((group, const))
        return f"\x01{block.id}.{number}\x01"

    def block(
        self, render: Callable[[], list[str]], depth: int, var: E.Var | None = None
    ) -> list[str]:
        """The lines `render` makes as one C block (with `var` bound in it, a loop's variable),
        each base pointer used twice or more declared at its top."""
        if var is not None:
            self._loop_vars.append(var)
        block = _Block(next(self._ids), frozenset(self._loop_vars))
        self._blocks.append(block)
        try:
            lines = render()
        finally:
            self._blocks.pop()
            if var is not None:
                self._loop_vars.pop()
        if not block.tokens:
            return lines
        uses: Counter[int] = Counter()
        for line in lines:
            for m in _TOKEN.finditer(line):
                if int(m[1]) == block.id:
                    uses[id(block.tokens[int(m[2])][0])] += 1
        pad = "  " * depth
        declarations = []
        for group in block.groups.values():
            if uses[id(group)] >= 2:
                buf = self._name(group.buffer)
                group.pointer = self._fresh(f"{group.buffer.name}_at")
                ct = self._ctype(group.buffer.dtype)
                declarations.append(f"{pad}{ct} *{group.pointer} = &{buf}[{group.base}];")

        def resolve(m: re.Match[str]) -> str:
            if int(m[1]) != block.id:
                return m[0]  # an enclosing block's
            group, const = block.tokens[int(m[2])]
            if group.pointer:
                return f"{group.pointer}[{const}]"
            return plain_element(self._name(group.buffer), group.base, const)

        return [
            *declarations,
            *(_TOKEN.sub(resolve, line) if "\x01" in line else line for line in lines),
        ]


def unresolved(text: str) -> bool:
    """Whether `text` still holds a token (a block was never closed: a renderer's bug)."""
    return "\x01" in text


def plain_element(buf: str, index: str, offset: int = 0) -> str:
    """`buf[index + offset]` in C."""
    if not offset:
        return f"{buf}[{index}]"
    return f"{buf}[{index} + {offset}]" if offset > 0 else f"{buf}[{index} - {-offset}]"


def _split(e: E.Expr, sign: int, terms: list[tuple[int, E.Expr]]) -> int:
    """Append the terms of `e` (times `sign`) to `terms`; return its constant part."""
    if isinstance(e, E.Add):
        return _split(e.a, sign, terms) + _split(e.b, sign, terms)
    if isinstance(e, E.Sub):
        return _split(e.a, sign, terms) + _split(e.b, -sign, terms)
    if isinstance(e, E.IntImm):
        return sign * e.value
    terms.append((sign, e))
    return 0


def _sum(terms: list[tuple[int, str]]) -> str:
    first_sign, first = terms[0]
    text = first if first_sign > 0 else f"(-{first})"
    for sign, term in terms[1:]:
        text = f"({text} {'+' if sign > 0 else '-'} {term})"
    return text


def _plain_vars(e: E.Expr) -> set[E.Var] | None:
    """The Vars `e` reads, or None when it reads memory."""
    found: set[E.Var] = set()
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, E.Var):
            found.add(node)
        elif isinstance(node, E.Load):
            return None
        stack.extend(E.children(node))
    return found

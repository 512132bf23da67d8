"""compiler/README.md's matmul example runs, and its lowered IR is the one the README shows
(the C differs by host vector width, so only the target-independent IR is compared)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from compiler.lower import lower

README = Path(__file__).resolve().parents[2] / "compiler" / "README.md"


def test_the_readme_matmul_lowers_to_the_ir_it_shows() -> None:
    text = README.read_text()
    section = text[text.index("## A matmul, end to end") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    shown = re.search(r"\n```\n(def matmul.*?)```", section, re.S)
    assert code is not None and shown is not None
    scope: dict[str, Any] = {}
    exec(code.group(1), scope)
    lowered = lower(scope["s"], [scope["A"], scope["B"], scope["C"]], "matmul")
    assert str(lowered).strip() == shown.group(1).strip()
    assert "# registers" in str(lowered)  # the tile was promoted

"""Every row lock is taken through llmgw.lock_order, the module that keeps the one order: the project's
code is read, and any ``select_for_update`` or ``FOR UPDATE``/``FOR SHARE`` elsewhere is named by file and
line (docstrings and comments may speak of them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agents", "facility", "placement", "llmgw")
OWNER = Path("llmgw/lock_order.py")
# A row-locking clause of PostgreSQL's, in SQL text.
LOCKING = re.compile(r"\bFOR\s+(?:NO\s+KEY\s+)?(?:UPDATE|SHARE|KEY\s+SHARE)\b")


def row_locks(source: str, path: str) -> list[str]:
    """``path:line`` of each row lock taken in ``source``: a call of select_for_update, or SQL text with a
    locking clause (a string that is not a docstring)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "select_for_update":
            found.add(node.lineno)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and LOCKING.search(node.value)
        ):
            found.add(node.lineno)
    return [f"{path}:{line}" for line in sorted(found)]


def project_files() -> list[Path]:
    return sorted(
        path.relative_to(ROOT)
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


def test_no_row_lock_is_taken_outside_the_lock_order_module():
    outside = [
        where
        for path in project_files()
        if path != OWNER
        for where in row_locks((ROOT / path).read_text(), str(path))
    ]
    assert outside == [], "row locks taken outside llmgw/lock_order.py (use rows_locked or lock_clause): " + ", ".join(
        outside
    )


def test_the_search_names_each_lock_by_file_and_line():
    source = '''"""Docstrings may say select_for_update and FOR UPDATE."""
# so may comments: select_for_update, FOR SHARE
def f():
    """Nor here: SELECT ... FOR UPDATE."""
    Node.objects.select_for_update().filter(name="a")
    cursor.execute(f"SELECT id FROM n WHERE name = %s ORDER BY name FOR UPDATE", [name])
    cursor.execute("SELECT 1 FROM b FOR   NO KEY UPDATE")
    cursor.execute("SELECT 1 FROM b FOR SHARE")
    return "before update"
'''
    assert row_locks(source, "x/y.py") == ["x/y.py:5", "x/y.py:6", "x/y.py:7", "x/y.py:8"]


def test_the_owner_itself_takes_locks_and_is_among_the_files_read():
    assert OWNER in project_files()
    assert row_locks((ROOT / OWNER).read_text(), str(OWNER))


def test_a_model_with_no_place_in_the_order_is_refused():
    from agents.models import GPU
    from llmgw.lock_order import ORDER, lock_key

    with pytest.raises(ValueError, match=r"^agents\.GPU has no place in the lock order \(llmgw\.lock_order\.ORDER\)$"):
        lock_key(GPU)
    assert [label for label, _ in ORDER] == [
        "facility.DcimSync", "placement.Model", "facility.Budget", "agents.Node", "placement.Replica", "access.ApiToken",
    ]

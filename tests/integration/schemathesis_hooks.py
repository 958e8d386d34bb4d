"""Loaded into the schemathesis process by test_schema_fuzz (SCHEMATHESIS_HOOKS).

CPython 3.11 keeps the AST constructor's recursion depth in state shared by every thread
(python/cpython#106905), so two threads in `ast.parse` at once can fail with "SystemError: AST
constructor recursion depth mismatch". Schemathesis's workers are threads, and Hypothesis parses
the source of the lambdas it describes: with `--workers 2` a run failed that way now and then, on
no fault of the server under test. One parse at a time keeps the workers and their speed.
"""

from __future__ import annotations

import ast
import functools
import threading

_parse = ast.parse
_one_at_a_time = threading.Lock()


@functools.wraps(_parse)
def _parse_alone(*args, **kwargs):
    with _one_at_a_time:
        return _parse(*args, **kwargs)


ast.parse = _parse_alone

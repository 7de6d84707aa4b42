"""Parsing the library's own source for the structural tests."""

import ast
import pathlib


def parse_source(path: pathlib.Path, attempts: int = 3) -> ast.Module:
    """``ast.parse`` of a file, retried on CPython 3.11's spurious SystemError.

    CPython 3.11 keeps the AST-conversion recursion counter in state shared by all threads, so a
    parse that overlaps another thread's work (orbax checkpoint threads left by earlier tests)
    can raise "AST constructor recursion depth mismatch" (python/cpython issue 106905, fixed in
    3.12). The file is unchanged; parsing it again is correct.
    """
    for attempt in range(attempts):
        try:
            return ast.parse(path.read_text(), filename=str(path))
        except SystemError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")

"""The rows of a user's .jsonl input file: one JSON object per non-empty line, each with an
optional ``id`` (read by every .jsonl input kind: pairs, ratios, multiple choice)."""

from __future__ import annotations

import json
import os
import sys

__all__ = ["json_rows", "row_id", "write_rows"]


def json_rows(path: str, lines: list[str]):
    """(line number, JSON object) of each non-empty line of a .jsonl file. Raises ValueError naming
    the file and line for a line that is not valid JSON or not an object."""
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not valid JSON ({e.msg}, column {e.colno})") from None
        except RecursionError:
            raise ValueError(f"{path}:{i}: JSON nested too deeply to read (over about "
                             f"{sys.getrecursionlimit()} levels of [ or {{): give flat rows") from None
        except ValueError as e:  # e.g. an integer of more digits than Python converts (sys.get_int_max_str_digits)
            why = str(e).split(":")[0].strip() or type(e).__name__
            raise ValueError(f"{path}:{i}: not readable as JSON ({why}): write a long number (e.g. an id) as a "
                             "string") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{i}: expected a JSON object, got {type(obj).__name__}")
        yield i, obj


def row_id(path: str, i: int, obj: dict, seen: dict) -> str:
    """A row's id: its "id" (a string or an integer) or its line number ``i``; ``seen`` {id: line}
    is updated. Raises ValueError naming the file and line for another type or a repeated id."""
    rid = obj.get("id", i)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise ValueError(f"{path}:{i}: \"id\" must be a string or an integer, got {rid!r}")
    if str(rid) in seen:
        raise ValueError(f"{path}:{i}: id {rid!r} was already used on line {seen[str(rid)]}")
    seen[str(rid)] = i
    return str(rid)


def write_rows(folder: str, name: str, rows: list[dict]) -> str:
    """Write ``rows`` as ``folder/name``, one JSON object per line; return its path (the input
    kinds' sample files, :mod:`infodiff.evaluation.queries`)."""
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path

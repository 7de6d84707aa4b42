"""report.txt fits a 100-column terminal for every report kind: a likelihood report on a split
(with an interval block), an input file (text with characters the text8 cleaning changes, long
paths), intervals on an input, multiple choice and a comparison of two runs. The reports in
tests/data/reports/ were written by evaluate.py on a tiny run (their report.json-only fields
emptied); each holds values longer than 100 characters."""

import json
from pathlib import Path

import pytest

from infodiff.evaluation import report as report_lib

DATA = Path(__file__).parent / "data" / "reports"
KINDS = ["split", "input", "intervals", "choices", "compare"]


def _flat(s: str) -> str:
    return "".join(s.split())


@pytest.mark.parametrize("kind", KINDS)
def test_every_line_fits_100_columns(kind):
    rep = json.loads((DATA / f"{kind}.json").read_text(encoding="utf-8"))
    text = report_lib.format_report(rep)
    lines = text.splitlines()
    too_long = [line for line in lines if len(line) > 100]
    assert not too_long, "\n".join(too_long)
    # nothing lost: every row's value and every line of the report is there, wrapped
    schema = report_lib.KINDS[rep["kind"]]
    flat = _flat(text)
    longest = 0
    for f in schema.keys():
        if f.name not in rep:
            continue
        how = schema.text(f)
        if isinstance(how, report_lib.Rows):
            for label, value in how.render(rep):
                assert str(label) in text and _flat(str(value)) in flat, (label, value)
                longest = max(longest, len(str(label)) + 2 + len(str(value)))
        elif isinstance(how, report_lib.Lines):
            for line in how.render(rep):
                assert _flat(line) in flat, line
    assert longest > 100  # the report had rows that did not fit: the test can fail
    assert lines[0] == schema.TITLE


def test_input_report_cleaning_row_is_wrapped_in_its_column():
    text = report_lib.format_report(json.loads((DATA / "input.json").read_text(encoding="utf-8")))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("CLEANED TEXT SCORED"))
    col = lines[at].index("a CLEANED copy")
    assert lines[at + 1].startswith(" " * (col + 2)) and lines[at + 1].strip()  # continued under the value


def test_wide_table_is_cut_into_column_groups_led_by_the_first_column():
    headers = ["id"] + [f"column {j}" for j in range(14)]
    rows = [[str(i + 1)] + [f"{i * j:.4f}" for j in range(14)] for i in range(3)]
    text = report_lib.table(headers, rows)
    blocks = text.split("\n\n")
    assert len(blocks) > 1 and max(len(line) for line in text.splitlines()) <= 100
    assert all(b.splitlines()[0].split()[0] == "id" for b in blocks)
    assert [b.splitlines()[2].split()[0] for b in blocks] == ["1"] * len(blocks)
    names = [h for b in blocks for h in b.splitlines()[0].split("  ") if h.strip() and h.strip() != "id"]
    assert [h.strip() for h in names] == headers[1:]  # every column once, in order
    narrow = report_lib.table(["a", "b"], [["1", "2"]])
    assert narrow == "a  b\n-  -\n1  2"  # a table that fits is unchanged

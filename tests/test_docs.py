"""The documentation's shape: README.md is a short front door (at most 15 KB) whose two set-up
commands are the install-and-run and install-and-test commands; docs/README.md lists every page
of docs/; every relative link in README.md and docs/*.md points at a file that exists."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 15 * 1024
    commands = [line for line in text.splitlines() if line.startswith("python3 -m venv .venv")]
    assert len(commands) == 2, commands
    assert commands[0].endswith("evaluate.py --workdir runs/masked_text"), commands[0]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q -r requirements.txt" in ci
    pytest_readme = commands[1][commands[1].index("-m pytest"):]
    pytest_ci = ci[ci.index("-m pytest"):].strip()
    assert pytest_readme == pytest_ci, (pytest_readme, pytest_ci)  # README's test command is what CI runs


def test_docs_index_lists_every_page():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert pages - listed == set(), f"docs/README.md does not list {sorted(pages - listed)}"


def test_relative_links_resolve():
    broken = []
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken

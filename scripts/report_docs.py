"""Write docs/report.md's key tables from the report schema (infodiff/evaluation/report.py).

  python scripts/report_docs.py          # rewrite the tables between the <!-- schema:NAME --> markers
  python scripts/report_docs.py --check  # exit 1 when the committed tables differ from the schema
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from infodiff.evaluation import report  # noqa: E402

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "report.md")

if __name__ == "__main__":
    check = "--check" in sys.argv[1:]
    same = report.write_docs(DOCS, check=check)
    print(f"{DOCS}: " + ("up to date" if same else ("differs from the schema: run python scripts/report_docs.py"
                                                    if check else "tables rewritten")))
    sys.exit(1 if check and not same else 0)

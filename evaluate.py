"""Likelihood report with standard errors (the installed ``infodiff-evaluate``):
infodiff/commands/evaluate.py.

    python evaluate.py --workdir runs/masked_text
"""

from infodiff.commands import evaluate

if __name__ == "__main__":
    evaluate.run()

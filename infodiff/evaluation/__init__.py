"""Likelihood reports: one evaluation path (:mod:`.run`), one schema (:mod:`.report`), plots."""

from infodiff.evaluation.report import REPORT_VERSION, format_report, strict_json, write_report
from infodiff.evaluation.run import MODES, evaluate, evaluate_network, evaluate_oracle

__all__ = ["REPORT_VERSION", "MODES", "evaluate", "evaluate_network", "evaluate_oracle",
           "format_report", "strict_json", "write_report"]

"""The experiments of Information-Theoretic Discrete Diffusion (arXiv 2510.24088 §5), outside the
core package: ``python run_experiment.py --config configs/exp_<name>.py --workdir results/<name>``.
They use only the public API of :mod:`infodiff`."""

from infodiff.experiments.paper import (auroc, error_stats, exact_time_free_values, markov_chain, md_table, python_docs_text,
                               toy_corpus, train_model, write_results)
from infodiff.experiments.run import run

__all__ = ["auroc", "error_stats", "exact_time_free_values", "markov_chain", "md_table", "python_docs_text", "run",
           "toy_corpus", "train_model", "write_results"]

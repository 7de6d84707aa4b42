"""Exact denoisers for distributions whose likelihood is known.

An oracle is a denoiser ``oracle(z_BxL, t_B) -> logprobs_BxLxV`` that returns the exact
conditionals c*(z)_{i,v} = p(x_i = v | unmasked part of z) (arXiv 2510.24088 Thm 3.5: the
minimiser of the denoising cross-entropy), plus exact ``log_prob`` (log p(x)) and
``cond_log_prob`` (log p(x[target] | x[context])). With an oracle, every masked-diffusion
likelihood estimator must reproduce the exact NLL up to Monte Carlo error; that is how this
project tests its estimators.

Two families:
  * TabularOracle: an enumerable distribution over sequences of length L, read from a JSON
    object {sequence: probability}; conditionals by summing the table.
  * MarkovOracle: a stationary k-th order Markov chain read from a JSON object
    {context: {symbol: probability}}; conditionals for any mask pattern by forward-backward
    over the V^k contexts (a hidden Markov model whose state is the last k symbols). The
    chain starts from its stationary context law, so a prompt sets the initial context of a
    response exactly: log p(y | x) = sum_j log P(y_j | previous k symbols).

The MASK id is vocab_size (= len(alphabet)); t is ignored (the exact conditionals are
time-free, RADD arXiv 2406.03736 Thm 1).

Both families also give the exact SEDD score ratios (concrete scores, arXiv 2310.16834 Eq. 4)
s*[b, i, v] = p_lam(z with z_i := v) / p_lam(z) of the noised law under the 'absorb' and
'uniform' graphs (docs/discrete_diffusion.md §1.2-1.3, §3.1, §5.1), at noise level
lam = 1 - exp(-sigma_bar):
  * ``log_score(z, lam, graph)``: float32 jax, jit-compatible (graph static);
  * ``log_score_np(z, lam, graph)``: float64 numpy reference (validates its inputs);
  * ``log_noised_marginal(z, lam, graph)``: float64 log p_lam(z).
Uniform ratios come from the leave-one-out posterior P(x_i = u | z_{-i}) (tabular: log-sum-exp
over the support; Markov: log-space forward-backward with soft emissions K_lam(z_j | u)).
Exact zeros are returned as ``LOG_ZERO`` (log of the smallest normal float32), never -inf.
"""

from __future__ import annotations

from infodiff.oracles.base import LOG_ZERO, SEDD_GRAPHS, Oracle
from infodiff.oracles.markov import MarkovOracle, markov_oracle_bytes, random_markov
from infodiff.oracles.tabular import TabularOracle, random_tabular

__all__ = [
    "Oracle",
    "TabularOracle",
    "MarkovOracle",
    "load_oracle",
    "random_tabular",
    "random_markov",
    "markov_oracle_bytes",
    "LOG_ZERO",
    "SEDD_GRAPHS",
]


def load_oracle(kind: str, path, alphabet: str | None = None, seq_len: int | None = None):
    """Build an oracle from a JSON file: kind 'tabular' or 'markov'."""
    if kind == "tabular":
        return TabularOracle.from_json(path, alphabet=alphabet)
    if kind == "markov":
        return MarkovOracle.from_json(path, alphabet=alphabet, seq_len=seq_len)
    raise ValueError(f"unknown oracle kind {kind!r}; expected 'tabular' or 'markov'")

"""Trained text networks bound to their parameters, in eval mode: what the estimators call.

* :class:`Denoiser` — a masked-diffusion :class:`~infodiff.networks.transformer.Transformer`:
  ``denoiser(z_BxL, t_B) -> logprobs_BxLxV``.
* :class:`ScoreModel` — a SEDD transformer and its score parameterisation:
  ``score_model(z_BxL, lam) -> log-scores [B, L, V]`` (lam [B], or per position [B, L]).

Both are frozen and compared / hashed by identity, so they can be static ``jax.jit`` arguments
or be closed over; ``apply_params(params, ...)`` lets jitted callers pass the parameters as
arguments instead of baking them into the compiled program as constants.
(:class:`infodiff.networks.count_denoisers.CountDenoiser` is the Poisson counterpart.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from infodiff.networks.transformer import Transformer
from infodiff.processes import score_entropy

__all__ = ["Denoiser", "ScoreModel"]


@dataclasses.dataclass(frozen=True, eq=False)
class Denoiser:
    """``denoiser(z_BxL, t_B) -> logprobs_BxLxV``: the network in eval mode (no dropout).

    Attributes:
      model: the :class:`Transformer`.
      params: its parameter pytree.
      vocab_size: V (property); the MASK id is V.
    """

    model: Transformer
    params: Any

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    def __call__(self, z_BxL: jax.Array, t_B: jax.Array) -> jax.Array:
        """z_BxL int [B, L] ids in [0, V] (V = MASK), t_B float32 [B] in [0, 1] ->
        float32 [B, L, V] log-probabilities over the V real tokens."""
        return self.apply_params(self.params, z_BxL, t_B)

    def apply_params(self, params: Any, z_BxL: jax.Array, t_B: jax.Array) -> jax.Array:
        """The same with explicit ``params``."""
        return self.model.apply({"params": params}, z_BxL, t_B, train=False)


@dataclasses.dataclass(frozen=True, eq=False)
class ScoreModel:
    """``score_model(z_BxL, lam) -> log-scores [B, L, V]`` (lam [B], or per position [B, L]): a SEDD network in eval mode.

    The network is conditioned on the noise level lam = 1 - exp(-sigma_bar(t)) in [0, 1]
    (passed as its time input). ``graph``: 'absorb' | 'uniform'; ``score_param``: 'direct' |
    'mean' (:func:`score_entropy.log_score_from_output`).
    """

    model: Transformer
    params: Any
    graph: str
    score_param: str

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    def __call__(self, z_BxL: jax.Array, lam_B: jax.Array) -> jax.Array:
        return self.apply_params(self.params, z_BxL, lam_B)

    def apply_params(self, params: Any, z_BxL: jax.Array, lam_B: jax.Array) -> jax.Array:
        """The same with explicit ``params``."""
        out = self.model.apply({"params": params}, z_BxL, lam_B, train=False)
        return score_entropy.log_score_from_output(self.graph, self.score_param, out, z_BxL, lam_B)

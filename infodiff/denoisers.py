"""The denoiser contract shared by trained networks and exact oracles.

Every process calls its denoiser the same way: ``apply_fn(params, inputs, noise_level)``.

  masked        ``(params, z_BxL int32, t_B float32) -> logprobs_BxLxV`` over the V real tokens
  score entropy ``(params, z_BxL int32, lam_B float32) -> log-scores [B, L, V]``
  Poisson       ``(params, z_BxD float32 counts, alpha_B float32) -> xhat_BxD > 0``

A *denoiser object* is either

* a network bound to its parameters: an object with ``apply_params(params, *inputs)`` and
  ``params`` (the estimators pass ``params`` to ``jax.jit`` as an argument, so one compiled
  program serves every parameter value), or
* a plain callable ``denoiser(*inputs)`` without parameters (the exact oracles of
  :mod:`infodiff.oracles` and :mod:`infodiff.count_oracles`, or any user function).

:func:`split` turns either into ``(apply_fn, params)``; ``apply_fn`` is hashable, so it can be
a static ``jax.jit`` argument. This module imports nothing from the rest of the library.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, runtime_checkable

__all__ = ["ApplyFn", "ParamDenoiser", "NoParams", "split", "vocab_size_of"]

ApplyFn = Callable[..., Any]


@runtime_checkable
class ParamDenoiser(Protocol):
    """A network bound to its parameters (see the module docstring)."""

    params: Any

    def apply_params(self, params: Any, *inputs: Any) -> Any: ...


@dataclasses.dataclass(frozen=True)
class NoParams:
    """Adapter: a parameter-free denoiser as ``apply_fn(params, *inputs)`` (``params`` unused).

    Equal (and hashed alike) for equal wrapped denoisers, so repeated calls with the same oracle
    reuse compiled programs.
    """

    denoiser: Callable[..., Any]

    def __call__(self, params: Any, *inputs: Any) -> Any:
        del params
        return self.denoiser(*inputs)


def split(denoiser: Any) -> tuple[ApplyFn, Any]:
    """``(apply_fn(params, *inputs), params)`` of a denoiser object (``params`` is None for a
    parameter-free callable). Raises TypeError if ``denoiser`` is neither kind."""
    if hasattr(denoiser, "apply_params") and hasattr(denoiser, "params"):
        return denoiser.apply_params, denoiser.params
    if not callable(denoiser):
        raise TypeError(f"a denoiser must be callable or have apply_params and params; got {type(denoiser).__name__}")
    return NoParams(denoiser), None


def vocab_size_of(denoiser: Any, vocab_size: int | None = None) -> int:
    """``vocab_size`` if given, else ``denoiser.vocab_size``. Raises ValueError if neither exists."""
    v = vocab_size if vocab_size is not None else getattr(denoiser, "vocab_size", None)
    if v is None:
        raise ValueError("vocab_size is required (the denoiser has no .vocab_size attribute)")
    return int(v)

"""infodiff: discrete diffusion models with trustworthy likelihoods (JAX).

``infodiff.load_run(workdir)`` loads a trained text run to score your own strings
(:mod:`infodiff.scoring`); ``infodiff.from_function(logprobs_fn, ...)`` scores a masked diffusion
model defined outside infodiff the same way (:mod:`infodiff.external`). Both are imported on first
use, so ``import infodiff`` stays light.
"""

__version__ = "0.1.0"


def __getattr__(name):
    if name in ("load_run", "Run"):
        from infodiff import scoring

        return getattr(scoring, name)
    if name == "from_function":
        from infodiff import external

        return external.from_function
    raise AttributeError(f"module 'infodiff' has no attribute {name!r}")

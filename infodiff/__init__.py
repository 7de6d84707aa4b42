"""infodiff: discrete diffusion models with trustworthy likelihoods (JAX)."""

__version__ = "0.1.0"

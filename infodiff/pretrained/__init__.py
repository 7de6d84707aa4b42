"""Released discrete diffusion language models (SEDD, MDLM, LLaDA ...) loaded natively in JAX."""

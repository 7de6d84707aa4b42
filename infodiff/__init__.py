"""infodiff: discrete diffusion models with trustworthy likelihoods (JAX).

``infodiff.load_run(workdir)`` loads a trained text run to score your own strings
(:mod:`infodiff.scoring`); ``infodiff.from_function(logprobs_fn, ...)`` scores a masked diffusion
model defined outside infodiff the same way (:mod:`infodiff.external`); ``infodiff.load_pretrained(dir)``
a released checkpoint (SEDD, MDLM ...: :mod:`infodiff.pretrained`, docs/pretrained.md); ``infodiff.compare(run_a,
run_b, texts)`` compares two runs on the same rows with a paired SE (:mod:`infodiff.compare`);
``infodiff.choose(run, prompts, choices)`` answers multiple-choice questions (:mod:`infodiff.choices`). All
are imported on first use, so ``import infodiff`` stays light.
"""

__version__ = "0.1.0"


def __getattr__(name):
    if name in ("load_run", "Run"):
        from infodiff import scoring

        return getattr(scoring, name)
    if name == "load_pretrained":
        from infodiff.pretrained import run

        return run.load_pretrained
    if name == "choose":
        from infodiff import choices

        return choices.choose
    if name == "from_function":
        from infodiff import external

        return external.from_function
    if name in ("compare", "Comparison"):
        import importlib

        module = importlib.import_module("infodiff.compare")  # callable: infodiff.compare(a, b, texts)
        return module if name == "compare" else module.Comparison
    raise AttributeError(f"module 'infodiff' has no attribute {name!r}")

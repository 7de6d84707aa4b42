"""Which experiment a config names: the paper's toys and tables (:mod:`infodiff.experiments.paper`)
and the paper's LLaDA tables on a released checkpoint (:mod:`infodiff.experiments.llada_tables`)."""

from infodiff.experiments import llada_tables, paper

__all__ = ["EXPERIMENTS", "run"]

EXPERIMENTS = {**paper.EXPERIMENTS, "llada_tables": llada_tables.run_llada_tables}


def run(config, workdir: str) -> dict:
    """Dispatch on config.experiment. Raises ValueError for an unknown experiment or a count
    setting below its minimum."""
    name = config.experiment
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose from {sorted(EXPERIMENTS)}")
    paper.check_counts(config)
    paper.say("experiment %s: writing to %s", name, workdir)
    return EXPERIMENTS[name](config, workdir)

"""Run one experiment of arXiv 2510.24088 §5 (the installed ``infodiff-experiment``):
infodiff/commands/experiment.py.

    python run_experiment.py --config configs/exp_dna128.py --workdir results/dna128
"""

from infodiff.commands import experiment

if __name__ == "__main__":
    experiment.run()

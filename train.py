"""Train a diffusion model (the installed ``infodiff-train``): infodiff/commands/train.py.

    python train.py --config configs/masked_text.py --workdir runs/masked_text
"""

from infodiff.commands import train

if __name__ == "__main__":
    train.run()

"""Figures written beside report.json (matplotlib is imported here only, when a plot is drawn)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["count_samples_png"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def count_samples_png(path: str, data, samples_NxD: np.ndarray, dist=None) -> None:
    """Generated count samples next to the truth: a 2-D histogram (2-D synthetic laws), a bar
    chart of the pmf (1-D laws, randhie), rolls (chorales) or image tiles (digits, Fashion-MNIST)."""
    plt = _pyplot()
    shape = data.event_shape
    if data.name.startswith("synthetic") and data.dim == 2 and dist is not None and dist.dim == 2:
        K = data.max_count + 1
        fig, axes = plt.subplots(1, 2, figsize=(8, 3.8))
        h = np.zeros((K, K))
        np.add.at(h, (samples_NxD[:, 0], samples_NxD[:, 1]), 1.0 / len(samples_NxD))
        t = np.zeros((K, K))
        sup = np.asarray(dist.support)
        t[sup[:, 0], sup[:, 1]] = dist.probs
        m = int(min(K, max(np.argwhere(t > 1e-4).max(), samples_NxD.max()) + 2))
        for ax, img, title in ((axes[0], h, "generated"), (axes[1], t, "true pmf")):
            ax.imshow(img[:m, :m].T, origin="lower", cmap="viridis", vmin=0, vmax=t.max())
            ax.set_title(f"{data.name} {title}")
            ax.set_xlabel("x1")
            ax.set_ylabel("x2")
    elif data.name.startswith("synthetic") or data.name == "randhie":
        fig, ax = plt.subplots(figsize=(6, 3.5))
        s = samples_NxD.reshape(-1)
        K = data.max_count + 1
        ax.bar(np.arange(K) - 0.2, np.bincount(s, minlength=K)[:K] / s.size, width=0.4, label="generated")
        if dist is not None:
            ax.bar(np.asarray(dist.support)[:, 0] + 0.2, dist.probs, width=0.4, label="true pmf")
        else:
            t = data.flat("test").reshape(-1)
            ax.bar(np.arange(K) + 0.2, np.bincount(t, minlength=K)[:K] / t.size, width=0.4, label="test data")
        ax.set_xlabel("count")
        ax.set_ylabel("probability")
        ax.set_title(f"{data.name}: {s.size} generated values")
        ax.legend()
    elif data.name == "chorales":
        # top row: real test windows; below: generated (pitch upwards, time to the right)
        real = data.flat("test")[np.linspace(0, len(data.test) - 1, 4).astype(int)]
        gen = samples_NxD[:8]
        panels = [(r, "test") for r in real] + [(g, "generated") for g in gen]
        rows = int(math.ceil(len(panels) / 4))
        fig, axes = plt.subplots(rows, 4, figsize=(12, 2.6 * rows), squeeze=False)
        for i, ax in enumerate(axes.flat):
            ax.set_xticks([])
            ax.set_yticks([])
            if i < len(panels):
                img, title = panels[i]
                ax.imshow(img.reshape(shape), cmap="Greys", vmin=0, vmax=2, origin="lower",
                          interpolation="nearest", aspect="auto")
                ax.set_title(title, fontsize=8)
            else:
                ax.axis("off")
        fig.suptitle("chorales (voice counts, 46 pitches x 32 eighth notes): test windows vs "
                     "increment-sampler samples")
    else:
        n = len(samples_NxD)
        cols = min(8, n)
        rows = int(math.ceil(n / cols))
        fig, axes = plt.subplots(rows, cols, figsize=(cols * 1.2, rows * 1.3), squeeze=False)
        for i, ax in enumerate(axes.flat):
            ax.axis("off")
            if i < n:
                ax.imshow(samples_NxD[i].reshape(shape), cmap="gray", vmin=0, vmax=data.max_count,
                          interpolation="nearest")
        fig.suptitle(f"{data.name}: increment-sampler samples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

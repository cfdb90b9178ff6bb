"""Plots of a search: the accuracy–latency and accuracy–FLOPs trade-offs with the front
highlighted over every trial."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed (CI, servers)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def front_2d(cost: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Indices of the 2-D non-dominated points (min cost, max accuracy), sorted by cost."""
    order = np.lexsort((-acc, cost))
    keep, best = [], -np.inf
    for i in order:
        if acc[i] > best:
            keep.append(i)
            best = acc[i]
    return np.asarray(keep, dtype=int)


def plot_pareto(trials: pd.DataFrame, path: str | Path, *, title: str = "") -> Path:
    """Two panels (accuracy vs latency, accuracy vs MFLOPs): every trial in grey, the
    3-objective Pareto set in colour, and each panel's own 2-D front as a step line."""
    path = Path(path)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True)
    on_front = trials["pareto"].to_numpy(bool)
    for ax, (column, label, scale) in zip(
        axes, [("latency_ms", "latency on this CPU (ms, onnxruntime, median)", 1.0),
               ("flops", "MFLOPs", 1e-6)]
    ):
        x = trials[column].to_numpy(float) * scale
        y = trials["accuracy"].to_numpy(float)
        ax.scatter(x[~on_front], y[~on_front], s=18, c="0.75", label="dominated trials")
        sc = ax.scatter(x[on_front], y[on_front], s=36, c=trials["size_bytes"][on_front] / 1024,
                        cmap="viridis", edgecolors="k", linewidths=0.5, zorder=3,
                        label="Pareto set (accuracy, FLOPs, latency)")
        idx = front_2d(x, y)
        ax.step(x[idx], y[idx], where="post", color="tab:red", lw=1.2, zorder=2,
                label="2-D front of this panel")
        ax.set_xlabel(label)
        ax.set_ylabel("validation accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.colorbar(sc, ax=axes, label="model size (KiB, fp32)")
    fig.suptitle(title or f"{len(trials)} trials, {int(on_front.sum())} Pareto-optimal")
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path

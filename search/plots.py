"""Plots of a search (PNG files, written atomically; no display needed).

* :func:`plot_fronts` — one panel per device: accuracy vs latency on the device, every trial
  grey (infeasible ones hollow), the device's Pareto set coloured by model size, its 2-D front
  as a step line.
* :func:`plot_across_devices` — the models of every device's front, their latency on each
  device relative to the fastest of them there: a model fast on one device and slow on
  another shows as a rising line (an Edge TPU front differs from a CPU front).
* :func:`plot_hypervolume` — hypervolume per device against the number of trials.
"""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib.pyplot as plt  # headless: matplotlib picks Agg by itself without a display
import numpy as np
import pandas as pd
from hwnas.search.pareto import front_indices_2d

from hwnas.core.io import write_atomic


def _save(fig, path: Path) -> Path:
    """Draw and write ``fig``. A font cache left by another matplotlib installation (seen on CI
    machines) lacks the mathtext fonts of log-axis ticks: matplotlib then falls back to DejaVu
    Sans, harmlessly, but warns once per family on stderr, burying the CLI's one line per
    problem; those warnings are held back while drawing."""
    fonts = logging.getLogger("matplotlib.font_manager")
    level = fonts.level
    fonts.setLevel(logging.ERROR)
    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    finally:
        fonts.setLevel(level)
        plt.close(fig)


def plot_fronts(trials: pd.DataFrame, fronts: dict[str, pd.DataFrame], path: str | Path, *,
                title: str = "") -> Path:
    """See the module docstring; ``fronts``: device -> its pareto frame."""
    devices = list(fronts)
    n = max(1, len(devices))
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 4.0 * rows), squeeze=False,
                             constrained_layout=True)
    feasible = trials["feasible"].to_numpy(bool) if "feasible" in trials else np.ones(len(trials), bool)
    size_kib = trials["size_bytes"].to_numpy(float) / 1024
    vmin, vmax = (float(size_kib.min()), float(size_kib.max())) if len(size_kib) else (0.0, 1.0)
    sc = None
    for ax, device in zip(axes.flat, devices):
        x = trials[f"latency_ms:{device}"].to_numpy(float)
        y = trials["accuracy"].to_numpy(float)
        ax.scatter(x[feasible], y[feasible], s=14, c="0.78", label="dominated trials")
        if (~feasible).any():
            ax.scatter(x[~feasible], y[~feasible], s=14, facecolors="none", edgecolors="0.6",
                       label="infeasible (constraints)")
        front = fronts[device]
        if not front.empty:
            fx = front[f"latency_ms:{device}"].to_numpy(float)
            fy = front["accuracy"].to_numpy(float)
            sc = ax.scatter(fx, fy, s=36, c=front["size_bytes"].to_numpy(float) / 1024,
                            cmap="viridis", vmin=vmin, vmax=vmax, edgecolors="k",
                            linewidths=0.5, zorder=3, label=f"Pareto set ({len(front)})")
            idx = front_indices_2d(fx, fy)
            ax.step(fx[idx], fy[idx], where="post", color="tab:red", lw=1.1, zorder=2)
        ax.set_xlabel(f"latency on {device} (ms)")
        ax.set_ylabel("validation accuracy (%)")
        ax.set_title(device, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=7)
    for ax in list(axes.flat)[len(devices):]:
        ax.set_visible(False)
    if sc is not None:
        fig.colorbar(sc, ax=axes, label="model size (KiB)", shrink=0.8)
    fig.suptitle(title or f"{len(trials)} trials")
    return _save(fig, path)


def plot_across_devices(trials: pd.DataFrame, fronts: dict[str, pd.DataFrame], path: str | Path,
                        *, max_models: int = 12) -> Path:
    """See the module docstring. At most ``max_models`` models (the most accurate of the union
    of the fronts, spread over the accuracy range)."""
    devices = list(fronts)
    union = pd.concat([f[["trial"]] for f in fronts.values()]).drop_duplicates()["trial"]
    models = trials[trials["trial"].isin(union)].sort_values("accuracy")
    if len(models) > max_models:
        pick = np.unique(np.linspace(0, len(models) - 1, max_models).round().astype(int))
        models = models.iloc[pick]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(devices) + 3), 4.6), constrained_layout=True)
    xs = np.arange(len(devices))
    cmap = plt.get_cmap("plasma")
    acc = models["accuracy"].to_numpy(float)
    lo, hi = (acc.min(), acc.max()) if len(acc) else (0.0, 1.0)
    for _, row in models.iterrows():
        rel = [row[f"latency_ms:{d}"] / models[f"latency_ms:{d}"].min() for d in devices]
        colour = cmap(0.1 + 0.8 * (row["accuracy"] - lo) / max(hi - lo, 1e-9))
        on = ["o" if row["trial"] in set(fronts[d]["trial"]) else "x" for d in devices]
        ax.plot(xs, rel, color=colour, lw=1.2, alpha=0.9)
        for x, r, m in zip(xs, rel, on):
            ax.scatter([x], [r], color=colour, marker=m, s=28, zorder=3)
        ax.annotate(f"#{int(row['trial'])} {row['accuracy']:.1f}%", (xs[-1], rel[-1]),
                    xytext=(4, 0), textcoords="offset points", fontsize=7, va="center")
    ax.set_xticks(xs, devices, rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("latency / fastest of these models on the device")
    ax.set_title("Pareto models across devices (o: on that device's front, x: not)")
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_hypervolume(history: pd.DataFrame, path: str | Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    for device, h in history.groupby("device", sort=False):
        final = h["hypervolume"].iloc[-1]
        ax.plot(h["trials"], h["hypervolume"] / final if final > 0 else h["hypervolume"],
                label=device)
    ax.set_xlabel("completed trials")
    ax.set_ylabel("hypervolume / final hypervolume")
    ax.set_title("search progress per device (accuracy vs latency)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)

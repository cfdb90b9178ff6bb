"""Session 55's cheap check of the NASWOT table (no search): Spearman with the NAS-Bench-201
CIFAR-100 accuracy over all cells, and within ten equal-count bands of a device's true latency
(mean over bands; the fastest band; each band's top accuracy quarter), for the score itself and
for its residual after a least-squares quadratic in the standardized log latency (variant R of
``benchmarks/search_nb201.md``, "Issue 47, session 55").

    python benchmarks/results/nb201_zero_cost/band_check.py
"""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from hwnas.supernet.data import shared_data_dir

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for the table's reader
from nb201_zero_cost import read_scores  # noqa: E402
DEVICES = ["pixel3", "samsung_a50", "samsung_s7", "essential_ph_1", "titanx_1", "titanx_256",
           "gold_6240"]


def residual(score: np.ndarray, lat: np.ndarray) -> np.ndarray:
    z = (np.log(lat) - np.log(lat).mean()) / np.log(lat).std()
    design = np.stack([np.ones_like(z), z, z * z], 1)
    return score - design @ np.linalg.lstsq(design, score, rcond=None)[0]


def main() -> int:
    root = shared_data_dir()
    if root is None:
        print("the shared data is absent (set HWNAS_SHARED_DATA)")
        return 1
    score = pd.Series(read_scores(HERE / "naswot.csv.gz"))
    acc = pd.read_csv(root / "nb201" / "nb201_cifar100_accuracy.csv").set_index("arch")
    acc = acc["cifar100_test_acc"].loc[score.index].to_numpy()
    lat = pd.read_csv(root / "latency" / "nb201_latency_ms.csv").set_index("arch").loc[score.index]
    print(f"NASWOT vs accuracy, all {len(score)} cells: {spearmanr(score, acc)[0]:.3f}")
    print("device: NASWOT vs latency; within bands (fastest band; top quarter) for NASWOT | "
          "residual; residual over all cells")
    for dev in DEVICES:
        t = lat[dev].to_numpy()
        band = pd.qcut(pd.Series(t).rank(method="first"), 10, labels=False).to_numpy()
        row = []
        for s in (score.to_numpy(), residual(score.to_numpy(), t)):
            w, top = [], []
            for b in range(10):
                m = band == b
                w.append(spearmanr(s[m], acc[m])[0])
                q = m & (acc >= np.quantile(acc[m], 0.75))
                top.append(spearmanr(s[q], acc[q])[0])
            row.append(f"{np.mean(w):.3f} ({w[0]:.3f}; {np.mean(top):.3f})")
        r_all = spearmanr(residual(score.to_numpy(), t), acc)[0]
        print(f"{dev}: {spearmanr(score, t)[0]:.3f}; {row[0]} | {row[1]}; {r_all:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

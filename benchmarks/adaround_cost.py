"""AdaRound's CPU seconds on one calibrated model, interleaved between two source trees, with
the learned integers compared (benchmarks/adaround_steps.md, Session 38)::

    git archive BASE | tar -x -C /tmp/base          # the code to compare against
    OMP_NUM_THREADS=1 HWNAS_SHARED_DATA=... python benchmarks/adaround_cost.py \\
        --subnet smallest --before /tmp/base [--after TREE] [--pairs 3] [--json out.json]

The W4A8 PTQ of ``quant_peers.py`` (``hwnas_w4a8_adaround``: first and last layer W8A8, MSE
observers, 512 calibration images) of a subnet of the shipped CIFAR-10 supernet is run with
this checkout up to AdaRound, and the calibrated model handed to :func:`adaround` is saved
(``--work``). Each run is then a fresh process that runs :func:`hwnas.quant.adaround.adaround`
on it (200 steps, inside ``retained_heap`` as PTQ does) with the ``--before`` or ``--after``
tree (through the editable install's module map, as ``export_ab.py`` does), in alternating
order; it reports AdaRound's CPU seconds (``time.process_time``) and the SHA-256 of every
layer's learned integers, which must agree between the trees for an exact change.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

try:  # run as a script, benchmarks/ is on sys.path; loaded by a test, the repo root is
    import export_ab
except ModuleNotFoundError:
    from benchmarks import export_ab

HERE = Path(__file__).resolve().parent.parent

#: run in the child (argv: the saved model, the steps); prints one JSON line and exits
_MEASURE = """
import hashlib, json, time, torch
from hwnas.core.heap import retained_heap
from hwnas.quant.adaround import AdaRoundConfig, adaround
from hwnas.quant.fake_quant import quant_layers
saved = torch.load(sys.argv[4], weights_only=False)
qmodel, config = saved["qmodel"], AdaRoundConfig(iterations=int(sys.argv[5]), seed=saved["seed"])
with retained_heap():
    start = time.process_time()
    report = adaround(qmodel, saved["xs"], config)
    cpu = time.process_time() - start
ints = torch.cat([torch.round(m.weight.detach() / m.weight_quant.qparams()[0].view(
    -1, *[1] * (m.weight.dim() - 1))).to(torch.int8).flatten() for _, m in quant_layers(qmodel)])
print(json.dumps({"adaround_cpu_s": cpu, "layers": len(report), "integers": len(ints),
                  "sha256": hashlib.sha256(ints.numpy().tobytes()).hexdigest()}))
sys.exit(0)
"""


def save_calibrated(subnet: str, checkpoint: str, path: Path) -> None:
    """The calibrated model and images the W4A8 PTQ hands to :func:`adaround`, saved."""
    import torch

    import hwnas.quant.ptq as ptq
    try:
        import quant_peers as peers
    except ModuleNotFoundError:
        from benchmarks import quant_peers as peers

    class Captured(Exception):
        pass

    def capture(qmodel, xs, config):
        torch.save({"qmodel": qmodel, "xs": xs, "seed": config.seed}, path)
        raise Captured

    _, _, net, calib, _ = peers.cifar10_subnet(checkpoint, subnet)
    learn, ptq.adaround = ptq.adaround, capture
    try:
        peers.hwnas_build(net, calib, "hwnas_w4a8_adaround")
    except Captured:
        pass
    finally:
        ptq.adaround = learn


def run_once(tree: Path, saved: Path, steps: int) -> dict:
    cmd = [sys.executable, "-c", export_ab._RUNNER, str(HERE), str(tree), _MEASURE,
           str(saved), str(steps)]
    # started outside the checkout: from it, ``import hwnas`` finds its ``hwnas/`` folder
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=saved.parent)
    if out.returncode != 0:
        raise SystemExit(f"AdaRound failed ({tree}):\n{out.stdout}{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subnet", default="smallest", help="smallest, middle or largest")
    ap.add_argument("--checkpoint", default=str(HERE / "supernet/checkpoints/mbv3_cifar10.pt"))
    ap.add_argument("--before", required=True, help="source tree to compare against")
    ap.add_argument("--after", default=str(HERE), help="default: this checkout")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--work", default="", help="folder of the saved model (default: temporary)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(args.work or tmp).resolve() / f"{args.subnet}_calibrated.pt"
        if not saved.is_file():
            saved.parent.mkdir(parents=True, exist_ok=True)
            save_calibrated(args.subnet, args.checkpoint, saved)
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for i in range(args.pairs):
            for which in (("before", "after") if i % 2 == 0 else ("after", "before")):
                r = run_once(Path(getattr(args, which)), saved, args.steps)
                runs[which].append(r)
                print(f"pair {i + 1} {which}: AdaRound {r['adaround_cpu_s']:.1f} CPU s, "
                      f"{r['layers']} layers, integers {r['sha256'][:16]}", flush=True)
    med = {k: statistics.median(r["adaround_cpu_s"] for r in v) for k, v in runs.items()}
    same = len({r["sha256"] for v in runs.values() for r in v}) == 1
    print(f"median AdaRound CPU s: before {med['before']:.1f}, after {med['after']:.1f} "
          f"({med['after'] / med['before']:.2f}x); learned integers "
          f"{'identical' if same else 'DIFFER'}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": " ".join(["python", "benchmarks/adaround_cost.py", *(argv or sys.argv[1:])]),
            "subnet": args.subnet, "steps": args.steps, "runs": runs, "median_cpu_s": med,
            "same_integers": same}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Wheel = checkout: the wheel and sdist build (``python -m build``), and the wheel, installed in
a fresh virtual environment and run from a folder outside the checkout, does what the editable
install does: ``hwnas --version``, the same ``hwnas latency devices`` (the measured tables are
package data), the on-device script as ``python -m hwnas.latency.ondevice``, a 2-trial
``hwnas run`` and ``hwnas.load_run`` on its result.

The fresh environment gets only the wheel (``pip install --no-deps``); its dependencies (torch,
optuna, onnxruntime, ...) are the ones this interpreter already has, reached through a ``.pth``
file listing this interpreter's site-packages folders. Installing them again from the registry
would download torch (~200 MB) on every CI run; what is tested here is what the wheel holds, and
``pip check`` confirms the dependencies it declares are met. A ``.pth`` line adds a folder to
``sys.path`` without running the ``.pth`` files inside it, so the editable install's finder
(which maps ``hwnas`` to the checkout) is not loaded: the test asserts that ``hwnas`` is
imported from the fresh environment.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 300
         ) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel, built from the checkout as a release would be (the wheel is
    built from the sdist, so a file missing from the sdist fails here)."""
    pytest.importorskip("build", reason="the 'build' package (in the dev extra) builds the wheel")
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], cwd=out,
         env=dict(os.environ), timeout=600)
    wheels, sdists = list(out.glob("hwnas-*.whl")), list(out.glob("hwnas-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    size = wheels[0].stat().st_size
    print(f"\nwheel {wheels[0].name}: {size / 2**20:.1f} MiB; sdist {sdists[0].name}: "
          f"{sdists[0].stat().st_size / 2**20:.1f} MiB")
    return {"wheel": wheels[0], "sdist": sdists[0]}


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> dict:
    """A fresh venv holding the wheel only, its dependencies reached through a ``.pth`` file;
    the environment its commands run in, and a working folder outside the checkout."""
    root = tmp_path_factory.mktemp("wheel-venv")
    env_dir = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], cwd=root,
         env=dict(os.environ))
    python = env_dir / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        cwd=root, env=dict(os.environ)).stdout.strip())
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "_hwnas_test_deps.pth").write_text("\n".join(deps) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
          "--no-index", "--quiet", str(built["wheel"])], cwd=root, env=dict(os.environ))
    work = root / "work"
    work.mkdir()
    (work / "devices").mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "HWNAS_LATENCY_TABLES", "VIRTUAL_ENV")}
    # the same reference data and no adapted devices for the wheel and the checkout alike
    shared = env.get("HWNAS_SHARED_DATA") or str(REPO.parent / "shared" / "data")
    env.update(OMP_NUM_THREADS="1", HWNAS_SHARED_DATA=shared,
               HWNAS_DEVICE_DIR=str(work / "devices"), PATH=f"{env_dir / 'bin'}:{env['PATH']}")
    return {"python": python, "bin": env_dir / "bin", "purelib": purelib, "work": work,
            "env": env}


def test_the_wheel_and_sdist_hold_the_package_data(built):
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    tables = [n for n in names if n.startswith("hwnas/latency/data/tables/")]
    assert any(n.endswith("nb201_xeon.csv.gz") for n in tables)
    assert any(n.endswith("_sessions.json") for n in tables)
    for name in ("hwnas/latency/ondevice.py", "hwnas/latency/data/nb201_meta.npz",
                 "hwnas/supernet/checkpoints/mbv3_cifar10.pt",
                 "hwnas/supernet/checkpoints/vit_cifar10.pt"):
        assert name in names
    # every checkpoint the checkout ships (cct_cifar10.pt once it is there), and no other
    shipped = {f"hwnas/supernet/checkpoints/{p.name}"
               for p in (REPO / "supernet" / "checkpoints").glob("*.pt")}
    in_wheel = {n for n in names if n.endswith(".pt")}
    assert shipped == in_wheel, sorted(shipped ^ in_wheel)
    # only hwnas at the top level, nothing of the checkout's benchmarks, tests or notebooks
    assert {n.split("/")[0] for n in names} == {"hwnas", f"{built['wheel'].name.split('-py')[0]}.dist-info"}


def test_installed_wheel_runs_like_the_checkout(venv, built, digits_checkpoint):
    env, work, python, bin_ = venv["env"], venv["work"], venv["python"], venv["bin"]
    where = _run([str(python), "-c", "import hwnas; print(hwnas.__file__)"], work, env).stdout
    assert Path(where.strip()).is_relative_to(venv["purelib"]), where  # not the checkout
    # the dependencies the wheel declares are met where it runs (others' conflicts are not ours)
    check = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "check"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert not [line for line in check.stdout.splitlines() if line.startswith("hwnas ")], check.stdout

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert _run([str(bin_ / "hwnas"), "--version"], work, env).stdout.split() == ["hwnas", version]

    # the same devices, descriptions included (table counts, session agreement), as the checkout
    wheel_devices = _run([str(bin_ / "hwnas"), "latency", "devices"], work, env).stdout
    checkout_devices = _run([sys.executable, "-m", "hwnas.cli", "latency", "devices"], work,
                            env).stdout
    assert wheel_devices == checkout_devices
    assert "xeon-ort-1t" in wheel_devices and "h200-cudagraph-b64" in wheel_devices

    help_text = _run([str(python), "-m", "hwnas.latency.ondevice", "--help"], work, env).stdout
    assert "--out" in help_text

    # the session's one-epoch digits supernet (tests/conftest.py) spares the training
    proc = subprocess.run([str(bin_ / "hwnas"), "run", "--supernet", str(digits_checkpoint),
                           "--trials", "2",
                           "--devices", "edgetpu-est", "--objectives", "accuracy,latency:edgetpu-est",
                           "--no-bits", "--name", "smoke", "--out", "runs", "--quiet"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    # exit 1: a front model failed a verification of its quantized file (none here: --no-bits)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code = ("import hwnas; r = hwnas.load_run('runs/smoke'); "
            "print(len(r.trials), sorted(r.fronts), r.config.trials)")
    assert _run([str(python), "-c", code], work, env).stdout.split()[0] == "2"

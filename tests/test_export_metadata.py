"""Self-describing ONNX: every exported file carries how to feed it (input name, shape, layout,
mean/std, class names) and what it is (arch, policy, accuracy, hwnas version), and
``--with-preprocessing`` adds uint8-NHWC-input variants. The end-to-end check runs the exported
files on the raw test images in a subprocess that imports only numpy and onnxruntime, and
reproduces the run's test accuracy."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from hwnas.export.model_export import ExportSettings
from hwnas.export.onnx_export import InputSpec, describe_model, with_uint8_input
from hwnas.export.qdq import read_metadata
from hwnas.export.run_export import export_run

from hwnas.core.errors import UserError

FAST = ExportSettings(warmup=1, rounds=1, runs=2, profile_runs=2,
                      uint8_input=True)
FRONT = "cpu-ort-1t"


@pytest.fixture(scope="module")
def exported(tmp_path_factory, one_torch_thread, fitted_digits_checkpoint):
    """A run directory (mbv3-tiny on digits, the smallest subnet fitted for a second, a float
    and an int8 row whose test accuracy the search's own scoring computed) and its export."""
    from hwnas.quant.policy import uniform
    from hwnas.search.evaluator import EvalSettings, TrialEvaluator, policy_text
    from hwnas.search.runner import score_models
    from hwnas.supernet.data import load_dataset
    from hwnas.supernet.train import load_checkpoint

    run = tmp_path_factory.mktemp("run")
    data = load_dataset("digits", seed=0)
    shutil.copy(fitted_digits_checkpoint, run / "supernet.pt")
    space, supernet, _ = load_checkpoint(run / "supernet.pt")
    small = space.smallest()
    (run / "config.json").write_text(json.dumps(
        {"space": space.name, "dataset": "digits", "data_seed": 0, "seed": 0, "calib_batches": 2,
         "ptq_images": 128, "devices": [FRONT], "bits": True}))
    arch = space.to_string(small)
    policy = policy_text(uniform(supernet.extract(small), 8, 8))
    import pandas as pd

    rows = pd.DataFrame([{"trial": 1, "arch": arch, "policy": ""},
                         {"trial": 2, "arch": arch, "policy": policy}])
    evaluator = TrialEvaluator(space, supernet, data, ["fpga-zcu102-est"],
                               EvalSettings(calib_batches=2, ptq_images=128, seed=0))
    scores = score_models(rows, evaluator)
    with open(run / f"pareto_{FRONT}.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["trial", "arch", "policy", "accuracy", "test_accuracy",
                         f"latency_ms:{FRONT}"])
        for trial, p in ((1, ""), (2, policy)):
            val, test = scores[(arch, p)]
            writer.writerow([trial, arch, p, val, test, 0.1 * trial])
    result = export_run(run, settings=FAST, progress=False, report=lambda line: None)
    return run, result, data, {t: scores[(arch, p)][1] for t, p in ((1, ""), (2, policy))}


def test_every_file_describes_its_input_and_provenance(exported) -> None:
    from hwnas import __version__

    _, result, data, _ = exported
    files = [f for m in result.models for f in m.files]
    assert {f.path.split("/")[0] for f in files} >= {"trial_0001.onnx", "uint8", "qdq",
                                                      f"qdq-{FRONT}", f"uint8-qdq-{FRONT}"}
    for f in files:
        assert f.ok, (f.path, f.error)
        proto = onnx.load(str(result.out_dir / f.path))
        meta = read_metadata(proto)
        uint8 = f.path.startswith("uint8")
        assert meta["input_name"] == ("image" if uint8 else "input")
        assert meta["input_shape"] == (["batch", 8, 8, 1] if uint8 else ["batch", 1, 8, 8])
        assert meta["input_layout"] == ("NHWC-uint8" if uint8 else "NCHW")
        assert meta["input_dtype"] == ("uint8" if uint8 else "float32")
        assert meta["mean"] == pytest.approx(list(data.mean))
        assert meta["std"] == pytest.approx(list(data.std))
        assert meta["class_names"] == data.classes
        assert meta["hwnas_version"] == __version__
        assert meta["arch"] and meta["accuracy"] is not None and meta["test_accuracy"]
        # the file's own policy: FP32 files are float, QDQ files carry the searched policy
        assert (meta["policy"] == "float") == (meta["precision"] == "fp32"), f.path
        assert meta["trial"] == 1 or meta["precision"] == "fp32" or "layers" in str(meta["policy"])
        assert proto.model_version == 1 and "mean" in proto.doc_string
        assert proto.doc_string.count(meta["input_name"]) >= 1


def test_exported_files_reproduce_the_run_test_accuracy_without_hwnas(exported, tmp_path) -> None:
    """numpy + onnxruntime only: the float files are fed by the recipe in their metadata, the
    uint8 ones the raw pixels; the float model's accuracy matches the run's within 0.1 point,
    the int8 files' within the width of one image's vote of the fake-quant figure."""
    _, result, data, run_acc = exported
    np.save(tmp_path / "images.npy", data.test.images.numpy())  # uint8 NCHW, as stored
    np.save(tmp_path / "labels.npy", data.test.labels.numpy())
    script = textwrap.dedent("""
        import json, sys
        import numpy as np
        import onnxruntime as ort
        images = np.load(sys.argv[1]).transpose(0, 2, 3, 1)  # raw pixels, NHWC as decoded
        labels = np.load(sys.argv[2])
        out = {}
        for path in sys.argv[3:]:
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            meta = sess.get_modelmeta().custom_metadata_map
            if meta["input_layout"] == "NHWC-uint8":
                x = images
            else:
                mean = np.array(json.loads(meta["mean"]), np.float32).reshape(1, -1, 1, 1)
                std = np.array(json.loads(meta["std"]), np.float32).reshape(1, -1, 1, 1)
                x = (images.transpose(0, 3, 1, 2).astype(np.float32) / 255 - mean) / std
            logits = sess.run([meta["output_name"]], {meta["input_name"]: x})[0]
            names = json.loads(meta["class_names"])
            assert len(names) == logits.shape[1]
            out[path] = {"accuracy": 100.0 * float(np.mean(logits.argmax(1) == labels)),
                         "run": float(meta["test_accuracy"]), "trial": int(meta["trial"])}
        print(json.dumps(out))
        if any(m.startswith("hwnas") for m in sys.modules):
            sys.exit("hwnas was imported")
    """)
    paths = [str(result.out_dir / f.path) for m in result.models for f in m.files]
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "images.npy"),
                           str(tmp_path / "labels.npy"), *paths],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    one_image = 100.0 / len(data.test.labels)
    measured = {str(result.out_dir / f.path): f.test_accuracy for m in result.models for f in m.files}
    for path, r in got.items():
        assert r["run"] == pytest.approx(run_acc[r["trial"]], abs=1e-9)
        if Path(path).parent.name.startswith(("qdq-", "uint8-qdq-")):
            # a device's int8/float mix: its float layers are chosen by timing, so it is held
            # to the figure the export measured for it and to the export's accuracy bound
            assert abs(r["accuracy"] - measured[path]) <= one_image + 1e-9, (path, r)
            assert r["accuracy"] >= r["run"] - ExportSettings().max_accuracy_drop, (path, r)
            continue
        tolerance = 0.1 if r["trial"] == 1 else one_image + 1e-9
        assert abs(r["accuracy"] - r["run"]) <= tolerance, (path, r)


def test_uint8_input_graph_normalises_like_training() -> None:
    from hwnas.export.qdq import float_proto
    from hwnas.latency.onnx_measure import make_session

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 4 * 4, 5)).eval()
    spec = InputSpec((0.4, 0.5, 0.6), (0.2, 0.25, 0.3), tuple("abcde"))
    proto = describe_model(float_proto(model, torch.zeros(1, 3, 6, 6)), spec)
    u8 = describe_model(with_uint8_input(proto, spec), spec)
    pixels = np.random.default_rng(0).integers(0, 256, (7, 6, 6, 3), dtype=np.uint8)
    x = (torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255
         - torch.tensor(spec.mean).view(1, 3, 1, 1)) / torch.tensor(spec.std).view(1, 3, 1, 1)
    got = make_session(u8.SerializeToString(), threads=1).run(None, {"image": pixels})[0]
    with torch.no_grad():
        want = model(x).numpy()
    assert np.abs(got - want).max() < 1e-4
    assert read_metadata(u8)["input_shape"] == ["batch", 6, 6, 3]
    with pytest.raises(UserError, match="channels"):
        with_uint8_input(proto, InputSpec((0.5,), (0.5,)))
    with pytest.raises(UserError, match="std must be positive"):
        InputSpec((0.5,), (0.0,))


def test_cli_flag_reaches_the_settings(tmp_path) -> None:
    from hwnas.cli import main

    assert main(["export", str(tmp_path / "missing"), "--with-preprocessing", "--quiet"]) == 2
    from hwnas.cli import build_parser

    args = build_parser().parse_args(["export", "RUN", "--with-preprocessing"])
    assert args.with_preprocessing


def test_uint8_parity_allows_its_float_parents_float32_error() -> None:
    """A uint8-input file of an FP32 parent is held to ``atol``, or to ``FLOAT32_SLACK`` times
    the parent's PyTorch float32 error where the parent passed by float32 rounding."""
    from hwnas.export.passes import ImagePasses
    from hwnas.export.qdq import float_proto
    from hwnas.export.records import FileReport
    from hwnas.export.verify import FLOAT32_SLACK, raw_images, verify_uint8
    from hwnas.latency.onnx_measure import make_session

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 4 * 4, 5)).eval()
    spec = InputSpec((0.4, 0.5, 0.6), (0.2, 0.25, 0.3), tuple("abcde"))
    u8 = describe_model(with_uint8_input(float_proto(model, torch.zeros(1, 3, 6, 6)), spec), spec)
    passes = ImagePasses(torch.randn(16, 3, 6, 6))
    raw = raw_images(passes.x, spec)
    want = make_session(u8.SerializeToString(), threads=1).run(None, {"image": raw})[0]
    want = want.astype(np.float64) + 1e-3  # the parent's logits, 1e-3 off
    s = ExportSettings()
    with pytest.raises(UserError, match="uint8-input parity failed: max difference"):
        verify_uint8(u8, want, passes, spec, FileReport("u.onnx", "fp32", ""), s, exact=True)
    report = FileReport("u.onnx", "fp32", "")
    verify_uint8(u8, want, passes, spec, report, s, exact=True,
                 parent_float32_error=1e-3 / FLOAT32_SLACK * 1.01)
    assert report.max_abs_diff == pytest.approx(1e-3, rel=1e-3)

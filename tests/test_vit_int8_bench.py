"""benchmarks/vit_int8.py on a tiny untrained vit subnet and synthetic 32x32 images: every
variant (torch float and fake-quant, the export's QDQ files on onnxruntime) gives a row, a rerun
measures nothing it has, and the table has one line per subnet."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
from hwnas.search.config import SearchConfig  # noqa: E402
from hwnas.supernet.data.splits import DatasetSplits, ImageSplit  # noqa: E402

from benchmarks import vit_int8  # noqa: E402


def _split(n: int, seed: int) -> ImageSplit:
    g = torch.Generator().manual_seed(seed)
    return ImageSplit(torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8),
                      torch.randint(0, 10, (n,), generator=g))


def test_every_variant_once_then_resumed(vit_tiny, tmp_path, one_torch_thread) -> None:
    data = DatasetSplits("synthetic", _split(32, 0), _split(8, 1), _split(24, 2),
                         [str(i) for i in range(10)], (0.5,) * 3, (0.25,) * 3, "crop_flip")
    cfg = SearchConfig(space="vit", dataset="cifar10", ptq_images=16, calib_batches=1, devices=[])
    torch.manual_seed(0)
    supernet = vit_tiny.build_supernet().eval()
    args = argparse.Namespace(work=str(tmp_path), max_seconds=0, checkpoint_sha256="ab" * 32)
    variants = [v for v in vit_int8.VARIANTS if not v.startswith("ov_")]  # OpenVINO: optional
    rows: list[dict] = []
    arch = vit_tiny.smallest()
    assert vit_int8.subnet_rows("smallest", arch, vit_tiny, supernet, data, cfg, variants, set(),
                                args, rows.append, 0.0)
    assert [r["variant"] for r in rows] == variants
    assert all(0 <= r["top1"] <= 100 and r["test_images"] == 24 for r in rows)
    assert (tmp_path / ("ab" * 8) / vit_tiny.to_string(arch) / "qdq_device.onnx").is_file()
    done = {(r["arch"], r["variant"]) for r in rows}
    again: list[dict] = []
    assert vit_int8.subnet_rows("smallest", arch, vit_tiny, supernet, data, cfg, variants, done,
                                args, again.append, 0.0)
    assert again == []
    # another checkpoint's file (another digest) exports its own QDQ files, never the first's
    args.checkpoint_sha256 = "cd" * 32
    fresh: list[dict] = []
    assert vit_int8.subnet_rows("smallest", arch, vit_tiny, supernet, data, cfg, ["ort_qdq"],
                                set(), args, fresh.append, 0.0)
    assert (tmp_path / ("cd" * 8) / vit_tiny.to_string(arch) / "qdq.onnx").is_file()
    table = vit_int8.markdown({"space": "vit", "date": "d", "commands": ["c"], "machine": "m",
                               "isa": {"isa": ["avx2"]}, "test_images": 24, "results": rows})
    line = next(t for t in table.splitlines() if vit_tiny.to_string(arch) in t)
    assert line.count("|") == len(variants) + 3


def test_front_is_the_one_scored_on_the_loaded_checkpoint(tmp_path) -> None:
    """cifar10_fronts.json labels rows by the --space that found the file (vit for the shipped
    cct_cifar10.pt): the front is looked up by file name, and a json scored on another file is
    refused: another name (its architectures are another space's), or the same name with other
    bytes (a supernet shipped since under that name)."""
    import hashlib
    import json

    from hwnas.core.errors import UserError
    from hwnas.core.io import file_sha256

    cct, vit = tmp_path / "x" / "cct_cifar10.pt", tmp_path / "x" / "vit_cifar10.pt"
    cct.parent.mkdir()
    cct.write_bytes(b"the file scored")
    vit.write_bytes(b"another space")
    assert file_sha256(cct) == hashlib.sha256(b"the file scored").hexdigest()
    doc = {"checkpoints": {"mbv3": "supernet/checkpoints/mbv3_cifar10.pt",
                           "vit": "supernet/checkpoints/cct_cifar10.pt"},
           "checkpoint_sha256": {"mbv3": "0" * 64, "vit": file_sha256(cct)},
           "fronts": {"params": {"vit": ["big", "small"], "mbv3": ["m"]},
                      "latency_ms:x": {"vit": ["small"]}},
           "results": [{"space": "vit", "arch": "big", "flops": 9},
                       {"space": "vit", "arch": "small", "flops": 1},
                       {"space": "mbv3", "arch": "m", "flops": 5}]}
    path = tmp_path / "fronts.json"
    path.write_text(json.dumps(doc))
    assert vit_int8.front_archs(cct, path) == ["small", "big"]
    with pytest.raises(UserError, match="cifar10_fronts.py again"):
        vit_int8.front_archs(vit, path)
    cct.write_bytes(b"a file shipped since under the same name")
    with pytest.raises(UserError, match="another cct_cifar10.pt .*cifar10_fronts.py again"):
        vit_int8.front_archs(cct, path)
    del doc["checkpoint_sha256"]  # a json from before the digests: which file is unknown
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match="another cct_cifar10.pt"):
        vit_int8.front_archs(cct, path)


def test_committed_cct_table_was_measured_on_the_shipped_file() -> None:
    """vit_int8_cct.json's rows were measured on the cct_cifar10.pt shipped now (its bytes):
    shipping another file means measuring the table again."""
    import json

    from hwnas.core.io import file_sha256
    from hwnas.supernet.checkpoints import CIFAR10_CLASSES, shipped_checkpoint

    doc = json.loads((Path(vit_int8.__file__).parent / "vit_int8_cct.json").read_text())
    shipped = shipped_checkpoint("cct", CIFAR10_CLASSES)
    assert shipped is not None and doc["checkpoint"] == shipped.name
    assert doc["checkpoint_sha256"] == file_sha256(shipped), (
        "vit_int8_cct.json was measured on another cct_cifar10.pt: run benchmarks/vit_int8.py "
        "again (the command is in the json)")

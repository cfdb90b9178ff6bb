"""Reproducible runs: ``--config FILE.toml`` for run/search/train/export with flags overriding
it, a run's config.json accepted as a config (CLI and :meth:`SearchConfig.from_dict`),
``hwnas --version``, the study's user attributes, the optuna-dashboard extra and the docs'
command for it, and a Ctrl-C message that names a command that exists."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import optuna
import pandas as pd
import pytest
from hwnas.search.config import SearchConfig
from hwnas.search.rundir import RunDir

from hwnas.cli import config_from_args, main, parse_args

ROOT = Path(__file__).resolve().parents[1]


def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    return str(path)


def test_version(capsys) -> None:
    from hwnas import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"hwnas {__version__}"


def test_toml_settings_and_command_line_precedence(tmp_path: Path) -> None:
    path = _toml(tmp_path, """
        space = "mbv3-tiny"
        trials = 7
        bit-choices = [4, 8]
        constraints = ["size<=200KiB"]
        sensitivity_seeds = false
        devices = ["edgetpu-est"]
        [search]
        seed = 3
        [export]
        select = "top:2"
        with-preprocessing = true
    """.replace("\n        ", "\n"))
    cfg = config_from_args(parse_args(["search", "--config", path]))
    assert (cfg.trials, cfg.bit_choices, cfg.seed, cfg.devices) == (7, [4, 8], 3, ["edgetpu-est"])
    assert cfg.constraints == ["size<=200KiB"] and cfg.sensitivity_seeds is False
    cfg = config_from_args(parse_args(["search", "--config", path, "--trials", "9", "--seed", "1"]))
    assert (cfg.trials, cfg.seed, cfg.bit_choices) == (9, 1, [4, 8])  # flags win, rest stays
    args = parse_args(["export", "RUN", "--config", path])
    assert (args.select, args.with_preprocessing) == ("top:2", True)
    assert parse_args(["export", "RUN", "--config", path, "--select", "all"]).select == "all"
    train = _toml(tmp_path, 'epochs = 3\ndevice = "cpu"\nout = "x.pt"\n')
    args = parse_args(["train", "--config", train])
    assert (args.epochs, args.out) == (3, "x.pt")


@pytest.mark.parametrize("text, message", [
    ("trials = 0\n", "trials"),
    ('trials = "ten"\n', "trials = 'ten': expected an integer"),
    ("tirals = 3\n", "unknown setting(s) tirals"),
    ("[search]\nselect = 'all'\n", "'select' is not a setting of 'hwnas search'"),
    ("[serach]\ntrials = 3\n", "table [serach] is not a command"),
    ("trials = \n", "is not valid TOML"),
    ('sampler = "annealing"\n', "sampler"),
    ("bits = 1\n", "bits = 1: expected true or false"),
])
def test_bad_settings_files_are_one_line(tmp_path: Path, capsys, text: str, message: str) -> None:
    code = main(["search", "--config", _toml(tmp_path, text), "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_missing_config_file_and_export_keys(tmp_path: Path, capsys) -> None:
    assert main(["search", "--config", str(tmp_path / "none.toml")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["export", "RUN", "--config", _toml(tmp_path, "[export]\ntrials = 3\n")]) == 2
    assert "'trials' is not a setting of 'hwnas export'" in capsys.readouterr().err
    assert main(["export", "RUN", "--config", _toml(tmp_path, "selekt = 'all'\n")]) == 2
    assert "unknown setting(s) selekt" in capsys.readouterr().err


def test_a_runs_config_json_is_a_config(small_run: Path, tmp_path: Path) -> None:
    """The run's config.json, given back, repeats the same search: same trials, same scores."""
    saved = json.loads(RunDir(small_run).config.read_text())
    cfg = SearchConfig.from_dict(saved, source="config.json")
    assert cfg.devices == saved["reported_devices"] and cfg.sensitivity_seeds is False
    with pytest.raises(Exception, match="unknown setting"):
        SearchConfig.from_dict({**saved, "colour": "red"})
    code = main(["search", "--config", str(RunDir(small_run).config), "--out", str(tmp_path),
                 "--name", "again", "--study-name", "again", "--quiet"])
    assert code == 0
    cols = ["trial", "arch", "policy", "accuracy", "latency_ms:edgetpu-est"]
    first = pd.read_csv(RunDir(small_run).trials_csv, keep_default_na=False)[cols]
    again = pd.read_csv(RunDir(tmp_path / "again").trials_csv, keep_default_na=False)[cols]
    pd.testing.assert_frame_equal(first, again)


def test_the_study_says_what_it_is_about(small_run: Path, digits_checkpoint: Path) -> None:
    from hwnas import __version__

    rd = RunDir(small_run)
    study = optuna.load_study(study_name="small", storage=rd.study_url())
    attrs = study.user_attrs
    assert attrs["space"] == "mbv3-tiny" and attrs["dataset"] == "digits"
    assert attrs["supernet"] == str(digits_checkpoint.resolve())
    assert attrs["hwnas_version"] == __version__
    assert attrs["devices"] == ["edgetpu-est"]


def test_dashboard_extra_and_the_readme_command(tmp_path: Path, monkeypatch) -> None:
    """The docs' optuna-dashboard command (docs/reference/cli.md, "Reproducible runs") points
    at the study a default run writes, and
    that storage URL opens (with the dashboard's WSGI app when it is installed: no server, no
    network)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("optuna-dashboard") for r in extras["dashboard"])
    readme = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert 'pip install -e ".[dashboard]"' in readme
    urls = re.findall(r"^optuna-dashboard (\S+)$", readme, flags=re.MULTILINE)
    assert urls, "docs/reference/cli.md has no optuna-dashboard command line"
    d = SearchConfig()
    default_run = Path(d.out) / f"{d.dataset}-{d.space}"
    assert urls[0] == f"sqlite:///{default_run / RunDir.STUDY}"
    monkeypatch.chdir(tmp_path)
    default_run.mkdir(parents=True)
    optuna.create_study(study_name="s", storage=urls[0], directions=["maximize"])
    assert [s.study_name for s in optuna.get_all_study_summaries(urls[0])] == ["s"]
    try:
        import optuna_dashboard
    except ImportError:
        return
    app = optuna_dashboard.wsgi(urls[0])
    assert callable(app)


def test_ctrl_c_names_a_command_that_exists(monkeypatch, capsys) -> None:
    from hwnas import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_search", interrupted)
    assert main(["search", "--trials", "3"]) == 130
    err = capsys.readouterr().err
    assert "--resume" not in err and "run the same command again to continue" in err

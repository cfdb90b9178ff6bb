"""``hwnas.search.run`` with an Optuna sampler object, and experiment tracking through Optuna's
own MLflow callback (``--mlflow URI``), against a local MLflow file store."""

from __future__ import annotations

import importlib.util
import json

import optuna
import pytest

from hwnas import search
from hwnas.core.errors import UserError
from hwnas.search.config import SearchConfig

SMALL = dict(trials=2, devices=["edgetpu-est"], objectives="accuracy,latency:edgetpu-est",
             sensitivity_seeds=False, progress=False, log=lambda *a: None)
HAS_MLFLOW = all(importlib.util.find_spec(m) for m in ("mlflow", "optuna_integration"))


def test_a_sampler_object_is_used_and_recorded_by_its_class(tmp_path, digits_checkpoint):
    sampler = optuna.samplers.NSGAIISampler(seed=3, population_size=4)
    result = search.run(supernet=str(digits_checkpoint), sampler=sampler, out=str(tmp_path),
                        name="obj", **SMALL)
    assert len(result.trials) == 2
    saved = json.loads((tmp_path / "obj" / "config.json").read_text())
    assert saved["sampler"] == "NSGAIISampler"
    study = optuna.load_study(study_name="obj", storage=f"sqlite:///{tmp_path}/obj/study.db")
    assert study.user_attrs["sampler"] == "NSGAIISampler"
    # continuing with the same kind of sampler object is the same run; another name is refused
    more = search.run(supernet=str(digits_checkpoint), out=str(tmp_path), name="obj",
                      sampler=optuna.samplers.NSGAIISampler(seed=4, population_size=4),
                      **{**SMALL, "trials": 3})
    assert len(more.trials) == 3
    with pytest.raises(UserError, match="sampler"):
        search.run(supernet=str(digits_checkpoint), out=str(tmp_path), name="obj",
                   sampler="random", **{**SMALL, "trials": 4})


@pytest.mark.parametrize("bad,match", [(object(), "Optuna sampler object"),
                                       ("annealing", "unknown sampler")])
def test_a_bad_sampler_is_one_user_error(bad, match):
    with pytest.raises(UserError, match=match):
        SearchConfig(sampler=bad).validate()


def test_a_sampler_object_is_refused_with_several_workers():
    with pytest.raises(UserError, match="sampler object"):
        SearchConfig(sampler=optuna.samplers.RandomSampler(), workers=2,
                     storage="postgresql://u@h/db").validate()


def test_mlflow_without_the_extra_is_one_user_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(UserError, match=r"hwnas\[mlflow\]"):
        SearchConfig(mlflow="file:./mlruns").validate()
    with pytest.raises(UserError, match="tracking URI"):
        SearchConfig(mlflow=" ").validate()


@pytest.mark.skipif(not HAS_MLFLOW, reason="the mlflow extra (mlflow-skinny, optuna-integration) "
                                           "is not installed: pip install 'hwnas[mlflow]'")
def test_every_trial_is_an_mlflow_run_in_a_local_file_store(tmp_path, digits_checkpoint,
                                                            monkeypatch):
    import mlflow

    # MLflow 3 keeps its file store for those who opt in (a server or a database otherwise)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    search.run(supernet=str(digits_checkpoint), out=str(tmp_path), name="tracked", mlflow=uri,
               **SMALL)
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tracked")  # named after the study
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2
    for run in runs:
        assert set(run.data.metrics) == {"accuracy", "latency_edgetpu-est"}
        assert 0 <= run.data.metrics["accuracy"] <= 100
        assert run.data.tags.get("space") == "mbv3-tiny"  # the study's user attributes

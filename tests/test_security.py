"""Passwords never leave the process: URLs masked in text, in what MLflow records and in the
hints `harness study` prints; the tracking URI's credentials handed to MLflow by its variables."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from harness.cli.main import main
from harness.store.masking import mask_text, mask_url, split_credentials
from harness.store.tracking import Tracker

SECRET = "s3cr:t@pw"


@pytest.mark.parametrize("url", [
    f"postgresql+psycopg://alice:{SECRET}@db.example:5432/optuna",
    f"mysql://bob:{SECRET}@10.0.0.1/x?charset=utf8",
    f"https://carol:{SECRET}@mlflow.example/",
    "sqlite:///x.db?password=" + SECRET.replace("@", "").replace(":", ""),
    "http://h/?token=" + SECRET.replace("@", "").replace(":", "") + "&a=1",
])
def test_mask_hides_the_password_and_keeps_the_rest(url):
    for text in (url, f"storage {url} is down", f"(`harness study run x.yaml --storage {url}`)"):
        masked = mask_text(text)
        assert "s3cr" not in masked and "***" in masked
    masked = mask_url(url)
    host = url.split("@")[-1].split("/")[0] if "@" in url else url.split("://")[1].split("/")[0]
    assert host in masked


def test_urls_without_password_are_unchanged():
    for url in ("sqlite:////tmp/o.db", "postgresql://alice@db/x", "http://127.0.0.1:5000", "file:///a/b"):
        assert mask_text(url) == url


def test_split_credentials_moves_them_out_of_the_uri():
    assert split_credentials("https://u:p%40ss@h:5000/x") == ("https://h:5000/x", "u", "p@ss")
    assert split_credentials("sqlite:///x.db") == ("sqlite:///x.db", None, None)


def test_tracker_masks_every_param_tag_and_artifact(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    storage = f"postgresql://alice:{SECRET}@db/optuna"
    tracker = Tracker(uri)
    run_id = tracker.start_run("e", run_name="r", tags={"storage": storage})
    tracker.log_params(run_id, {"tracking": {"uri": storage}, "note": f"see {storage}"})
    tracker.set_tags(run_id, {"later": storage})
    tracker.log_dict(run_id, {"storage": storage}, "config.json")
    tracker.end_run(run_id, "FINISHED")
    run = MlflowClient(uri).get_run(run_id)
    recorded = json.dumps([run.data.params, run.data.tags])
    path = MlflowClient(uri).download_artifacts(run_id, "config.json", str(tmp_path))
    with open(path) as f:
        recorded += f.read()
    assert "s3cr" not in recorded and recorded.count("alice:***@db") >= 5


def test_study_create_hint_masks_the_storage_password(tmp_path, capsys):
    from test_study import tiny_study

    path = tiny_study(tmp_path)
    # An unreachable PostgreSQL: the error names the URL, masked.
    code = main(["study", "create", str(path), "--storage",
                 f"postgresql+psycopg://alice:{SECRET}@127.0.0.1:9/none",
                 "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    out = capsys.readouterr()
    assert code != 0 and "s3cr" not in out.out + out.err and "alice:***@" in out.err


def test_every_torch_load_is_weights_only():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    calls = []
    for path in [*root.glob("harness/**/*.py"), *root.glob("harness_plugins/**/*.py")]:
        text = path.read_text()
        for m in re.finditer(r"torch\.load\(", text):
            call = text[m.start(): text.find(")", m.start()) + 1]
            calls.append((path.name, call))
    assert all("weights_only=True" in call for _, call in calls), calls


def test_a_config_is_data_python_tags_are_refused(tmp_path, capsys):
    marker = tmp_path / "pwned"
    path = tmp_path / "run.yaml"
    path.write_text(f"task: !!python/object/apply:os.system ['touch {marker}']\n")
    code = main(["train", str(path), "--max-steps", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and not marker.exists() and "Traceback" not in err

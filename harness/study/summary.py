"""The study's parent MLflow run: its protocol params and the saved view of the runs table.

Params (logged when the study is created, :func:`protocol_params`): the protocol (objective,
budget with its parameter target, confirmation seeds, sampler, pruner, task) and each
candidate's definition under ``candidate.<name>.*``, as values (JSON), never Python reprs.
The summary metrics and the description, which need the report's numbers, are written by
:mod:`harness.report.summary`.
"""

from __future__ import annotations

from typing import Any

from harness.keys import Tag, val_key
from harness.study.schema import StudyConfig
from harness.study.storage import StudyHandle

NOTE_TAG = "mlflow.note.content"


def protocol_params(config: StudyConfig) -> dict[str, Any]:
    """The parent run's params: the protocol, with candidates keyed by name."""
    proto = config.protocol_dict()
    candidates = proto.pop("candidates")
    proto["confirm"]["seed_list"] = config.confirm_seeds()
    proto["confirm"]["baseline"] = config.baseline  # the first candidate unless named
    proto["candidate"] = {c.pop("name"): c for c in candidates}
    return proto


# -- the runs table's view --------------------------------------------------------------------
VIEW_TAG = "mlflow.sharedViewState."  # + key: a view of the runs table the UI opens by link


def view_key(study: str) -> str:
    return f"harness-{study}"


def study_view(handle: StudyHandle) -> dict[str, Any]:
    """The runs table grouped by candidate, with the objective at every evaluation length,
    the phase, the seed and the shared searched parameters as columns (MLflow's shared view
    state; the link is ``...runs?viewStateShareKey=harness-<study>``)."""
    cfg = handle.config
    lengths = [int(n) for n in handle.record["eval_lengths"]]
    columns = [f"metrics.`{val_key(cfg.objective.metric, n)}`" for n in lengths]
    columns += [f"tags.`{Tag.PHASE}`", f"tags.`{Tag.SEED}`"]
    columns += [f"params.`train.{name}`" for name in cfg.search]
    return {"groupBy": {"aggregateFunction": "average",
                        "groupByKeys": [{"mode": "tag", "groupByData": Tag.CANDIDATE}]},
            "selectedColumns": columns}


def publish_view(handle: StudyHandle) -> None:
    """Store the study's view on its experiment (idempotent)."""
    import json

    experiment = handle.experiment_id()
    value = json.dumps(study_view(handle))
    tags = handle.tracker.client.get_experiment(experiment).tags
    if tags.get(VIEW_TAG + view_key(handle.name)) != value:
        handle.tracker.client.set_experiment_tag(experiment, VIEW_TAG + view_key(handle.name), value)

"""What a saved model keeps besides its weights, and how it is read back.

``model.json`` (and a Hub folder's ``config.json`` under ``harness``: :func:`meta_of`) holds
the run's resolved config, its task's kind, every field of its task's info
(:meth:`~harness.data.tasks.TaskInfo.record`: whatever changes what the model computes, such as
the document token of ``documents: separate`` or a task's ``two_tower`` hint), its
vocabulary's symbols and the identity of what it trained on (:mod:`harness.run.identity`). A
run that reads text keeps its tokenizer beside its weights (``tokenizer.json``), checked
against that identity when read (:func:`saved_tokenizer`); :func:`tokenizer_of` gives the
tokenizer a loaded run reads text with: the saved one, else its task's built again and
compared with the record. :func:`info_of` rebuilds the info of a ``model.json`` written before
it kept every field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.data.corpus import TOKENIZER_FILE
from harness.data.tasks import TaskInfo
from harness.errors import HarnessError
from harness.run import exported, identity

#: The largest tokenizer file read beside a model (a 1M-id BPE is about 60 MB).
MAX_TOKENIZER_BYTES = 256 << 20


def meta_of(config: dict[str, Any], task_kind: str, info: TaskInfo, symbols: Any,
            data: dict[str, str], **more: Any) -> dict[str, Any]:
    """What ``model.json`` holds (and a Hub folder's ``config.json`` under ``harness``)."""
    return {"config": config, "task_kind": task_kind, "info": info.record(), "symbols": list(symbols),
            "data": dict(data), **more}


def recorded(meta: dict[str, Any]) -> dict[str, str]:
    """The identity a ``model.json`` records; its vocabulary's digest from its symbols (which
    every ``model.json`` has, however old)."""
    data = meta.get("data")
    return {**({str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}),
            "vocab_sha256": identity.vocab_digest(meta["symbols"])}


def info_of(saved: dict[str, Any], p: Any) -> TaskInfo:
    """The task info a ``model.json`` saved; a ``model.json`` written before it kept every
    field (format, sizes and classes only) gets the task's hints from its class and, where
    its config keeps documents apart, the document token from its task built again."""
    info = TaskInfo.from_record(saved)
    if "extra" not in saved:
        hints = getattr(p.task.spec.build, "model_hints", None)
        info.extra = dict(hints) if isinstance(hints, dict) else {}
    if "document_token" not in saved and p.task.params.separate_documents():
        from harness.run.build import build_task

        info.document_token = build_task(p, seed=p.config.train.data_seed).document_token
    return info


def saved_tokenizer(folder: Path, meta: dict[str, Any]) -> str | None:
    """The ``tokenizer.json`` beside a model's weights (None when there is none), checked to be
    the tokenizer ``meta`` records (its SHA-256)."""
    from harness.runtime.files import open_regular

    path = folder / TOKENIZER_FILE
    if not path.exists() and not path.is_symlink():
        return None
    try:
        with open_regular(path, "the model's tokenizer") as fh:
            text = fh.read(MAX_TOKENIZER_BYTES + 1).decode("utf-8")
    except HarnessError as exc:
        raise exported.DamagedExport(str(exc)) from None
    except UnicodeDecodeError:
        raise exported.DamagedExport(f"{path}: not UTF-8 text. Export the run again.") from None
    want = recorded(meta).get("tokenizer_sha256")
    if len(text) > MAX_TOKENIZER_BYTES or (want and identity.digest(text) != want):
        raise exported.DamagedExport(
            f"{path} is not the tokenizer the run trained with (model.json records sha256 "
            f"{(want or '')[:identity.SHOWN]}, the file is {identity.digest(text)[:identity.SHOWN]}): "
            f"text read with it would be scored wrongly. Export the run again (harness export "
            f"RUN_ID --out DIR).")
    return text


def tokenizer_of(trained: Any) -> Any:
    """The tokenizer a run reads text with (:class:`harness.data.tokenizers.Tokenizer`), or
    None for a task without one (a symbol task): the one saved beside its weights, else its
    task's built again, refused (:class:`harness.run.identity.DataChanged`) when it is not the
    one the run recorded. Built once per loaded run."""
    cached = getattr(trained, "_tokenizer", None)
    if cached is not None:
        return cached
    from harness.data.tokenizers import tokenizer_from_json

    if trained.tokenizer_json is not None:
        tokenizer = tokenizer_from_json(trained.tokenizer_json, TOKENIZER_FILE)
    else:
        tokenizer = _task_tokenizer(trained)
    trained._tokenizer = tokenizer  # type: ignore[attr-defined]
    return tokenizer


def _task_tokenizer(trained: Any) -> Any:
    from harness.config import parse_run_config
    from harness.run.build import build_task
    from harness.run.plan import load_registry, plan

    data = dict(trained.config)
    data["tracking"] = {k: v for k, v in (data.get("tracking") or {}).items() if k != "uri"}
    cfg = parse_run_config(data, "the trained model's config")
    p = plan(cfg, load_registry(cfg, None))
    task = build_task(p, seed=cfg.train.data_seed)
    tokenizer = getattr(task, "tokenizer", None)
    if tokenizer is None:
        return None
    before = trained.identity
    if set(before) <= {"vocab_sha256"} and trained.source.startswith("run "):
        before = {**identity.recorded_by_run(trained.source[4:]), **before}
    identity.check(before, identity.of_task(task),
                   what=f"{trained.source}: its tokenizer, read from its task's data as it is now",
                   fix=identity.FIX_TOKENIZER, data=False)
    return tokenizer

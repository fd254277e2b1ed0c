"""A trained run in the Hugging Face Hub layout, through ``huggingface_hub``'s
``PyTorchModelHubMixin``: ``harness export RUN_ID --format hf --out DIR`` and
``HubModel.from_pretrained(DIR)``.

The folder holds ``model.safetensors`` (the weights; keys under ``model.``), ``config.json``
(under ``harness``: what :mod:`harness.run.trained` keeps in ``model.json``: the resolved run config, the task's
batch format, vocabulary size and symbols; plus ``components``: each plugin by role with its
package and version, and ``harness_version``), ``tokenizer.json`` (the run's tokenizer: a
Hugging Face tokenizer file for ``bpe`` and ``tokenizer.json`` corpora, the harness's small
JSON for ``bytes``/``chars``, the symbol list for a symbol task) and ``README.md`` (the model
card: architecture, plugins and versions, data, budget, metrics, harness version).
``HubModel(...).push_to_hub(repo_id)`` uploads it (documented in docs/evaluation.md; not
tested here: no network).

**Loading never runs code from the folder.** The config is JSON, the weights safetensors,
the tokenizer JSON; the model is built from the *installed* plugins (entry points). A config
naming local plugin files (``plugins:``) does not load them: when a component is not
installed, the error names every missing one with its package and version, and says to install
it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import PyTorchModelHubMixin

from harness.data.corpus import TOKENIZER_FILE
from harness.errors import HarnessError, shorten

CARD_FILE = "README.md"
CONFIG_FILE = "config.json"
#: marks a config.json written by the harness
FORMAT = "attention-harness"


def harness_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attention-harness")
    except PackageNotFoundError:  # pragma: no cover - a source tree never installed
        return "unknown"


def components(config: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each plugin of a run config by role: name, plugin, package (distribution), version."""
    from harness.config import parse_run_config
    from harness.run.plan import load_registry, plan

    cfg = parse_run_config(_without_uri(config), "the trained model's config")
    p = plan(cfg, load_registry(cfg, None))
    return {role: {"name": c.name, "plugin": str(c.spec.plugin), "package": str(c.spec.distribution),
                   "version": str(c.spec.version)} for role, c in p.components().items()}


def _without_uri(config: dict[str, Any]) -> dict[str, Any]:
    data = dict(config)
    data["tracking"] = {k: v for k, v in (data.get("tracking") or {}).items() if k != "uri"}
    return data


def check_installed(meta: dict[str, Any]) -> dict[str, Any]:
    """The run config to build, local plugin files dropped; a HarnessError naming every
    component the installed plugins do not provide."""
    from harness.registry import loader

    config = _without_uri(meta["config"])
    local = list(config.get("plugins") or [])
    config["plugins"] = []
    registry = loader.load([])
    missing = []
    for role, comp in (meta.get("components") or {}).items():
        kind = "attention" if role.startswith("attention") else role
        try:
            registry.get(kind, comp["name"])
        except HarnessError:
            source = f"{comp.get('package') or comp.get('plugin')} {comp.get('version', '')}".strip()
            missing.append(f"{role} {comp['name']!r} (from {source})")
    if missing:
        files = f" The run loaded them from local files {local}; a shared model never runs code " \
                f"from its folder or config: install those plugins as a package." if local else ""
        raise HarnessError(f"this model needs plugins that are not installed: {'; '.join(missing)}. "
                           f"Install them (and attention-harness {meta.get('harness_version', '')}) "
                           f"and load it again.{files}")
    return config


class HubModel(torch.nn.Module, PyTorchModelHubMixin,  # type: ignore[misc]
               library_name="attention-harness", tags=["attention-harness"],
               repo_url="https://github.com/attention-harness/attention-harness"):
    """A trained harness model with its harness config, savable and loadable in the Hub
    layout (see the module)."""

    def __init__(self, harness: dict[str, Any], model: Any = None) -> None:
        super().__init__()
        from harness.data.tasks import TaskInfo
        from harness.run.trained import _build

        if model is None:
            built = check_installed(harness)
            model, _ = _build({**harness, "config": built})
        self.model = model
        self.harness_meta = harness
        self.info = TaskInfo.from_record(harness["info"])
        self.codec_json: str | None = None
        self.card: str = ""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        super()._save_pretrained(save_directory)
        if self.codec_json is not None:
            (save_directory / TOKENIZER_FILE).write_text(self.codec_json, encoding="utf-8")
        if self.card:
            (save_directory / CARD_FILE).write_text(self.card, encoding="utf-8")


def _metrics(run_id: str, tracking_uri: str | None) -> dict[str, float]:
    from harness.store.tracking import Tracker

    with contextlib.suppress(Exception):  # the card is written without them when the store is away
        run = Tracker(tracking_uri).client.get_run(run_id)
        return {k: float(v) for k, v in run.data.metrics.items()
                if k.startswith(("val/", "test/", "eval/")) and "_len" not in k}
    return {}


def model_card(meta: dict[str, Any], metrics: dict[str, float]) -> str:
    """The README.md of an exported model (YAML header for the Hub, then Markdown)."""
    cfg = meta["config"]
    comps = meta.get("components") or {}
    lines = ["---", "library_name: attention-harness", "tags:", "- attention-harness",
             "- pytorch_model_hub_mixin", "---", "",
             f"# {cfg['model']['name']} on {cfg['task']['name']}", "",
             f"A model trained with attention-harness {meta.get('harness_version', '')} "
             f"(run `{meta.get('run_id', '')}`). Load it with the harness and its plugins installed:",
             "", "```python", "from harness.run.hub import load_hf",
             "trained = load_hf(\"THIS_FOLDER_OR_REPO\")  # .model, .config, .vocab", "```", "",
             "## Architecture", "", "| role | plugin | package | version | params |", "|---|---|---|---|---|"]
    for role, comp in comps.items():
        params = (cfg.get(role) or {}).get("params", {}) if "." not in role else {}
        lines.append(f"| {role} | {comp['name']} | {comp.get('package', '')} | {comp.get('version', '')} "
                     f"| `{json.dumps(params, sort_keys=True)}` |")
    info = meta["info"]
    lines += ["", f"Batch format `{info['format']}`, vocabulary {info['vocab_size']} ids, longest "
              f"training input {info['max_length']} tokens.", "", "## Data", "",
              f"Task `{cfg['task']['name']}` (kind {meta.get('task_kind')}), params "
              f"`{json.dumps(cfg['task'].get('params', {}), sort_keys=True)}`; tokenizer: "
              f"{meta.get('tokenizer', 'see tokenizer.json')}.", "", "## Budget", ""]
    train = cfg.get("train", {})
    lines.append(", ".join(f"{k} {train[k]}" for k in ("max_steps", "batch_size", "lr", "weight_decay",
                                                         "optimizer", "schedule", "seed") if k in train) + ".")
    lines += ["", "## Metrics", ""]
    if metrics:
        lines += ["| metric | value |", "|---|---|"] + [f"| {k} | {v:.6g} |" for k, v in sorted(metrics.items())]
    else:
        lines.append("(none recorded with the export)")
    return "\n".join(lines) + "\n"


def to_hub_model(trained: Any, run_id: str = "", tracking_uri: str | None = None) -> HubModel:
    """A :class:`HubModel` of a loaded run, with its tokenizer and model card."""
    from harness.evaluation.text import codec_of
    from harness.run import identity
    from harness.run.saved import meta_of, tokenizer_of

    tokenizer = tokenizer_of(trained)
    data = {**trained.identity, **({"tokenizer_sha256": identity.digest(tokenizer.to_json()),
                                    "tokenizer": str(tokenizer.name)} if tokenizer is not None else {})}
    meta = {"format": FORMAT, **meta_of(trained.config, trained.task_kind, trained.info, trained.vocab.symbols,
                                        data, run_id=run_id, components=components(trained.config),
                                        harness_version=harness_version())}
    codec = codec_of(trained)
    meta["tokenizer"] = codec.name
    hub = HubModel(meta, model=trained.model)
    hub.codec_json = codec.to_json()
    hub.card = model_card(meta, _metrics(run_id, tracking_uri) if run_id else {})
    return hub


def export_hf(run_id: str, out: str | Path, tracking_uri: str | None = None) -> Path:
    """Write a run in the Hub layout into a new folder ``out`` (refused if it exists)."""
    from harness.run.trained import load

    target = Path(out)
    if target.exists():
        raise HarnessError(f"--out {target} already exists; export writes a new folder and "
                           f"never overwrites one. Pick another path or remove it first.")
    hub = to_hub_model(load(run_id), run_id, tracking_uri)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        hub.save_pretrained(tmp)
        umask = os.umask(0)
        os.umask(umask)
        for file in tmp.iterdir():  # a folder to share: readable as the umask allows (safetensors writes 0600)
            file.chmod(0o666 & ~umask)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def is_hub_folder(path: Path) -> bool:
    """Whether ``path`` is a folder in the harness's Hub layout (False for anything else: a run
    id, a name too long for a path, a folder of ``harness export``)."""
    with contextlib.suppress(OSError, ValueError):
        config = path / CONFIG_FILE
        if not config.is_file():
            return False
        data = json.loads(config.read_text())
        return isinstance(data, dict) and (data.get("harness") or {}).get("format") == FORMAT
    return False


def load_any(ref: str | Path, *, trust_plugins: bool = False) -> Any:
    """A trained run from a run id, a folder of ``harness export`` or one in the Hub layout
    (which never runs code from the folder: ``trust_plugins`` is for ``model.json``'s plugin
    files). Every failure is a :class:`~harness.errors.HarnessError`."""
    from harness.run.trained import load

    if not is_hub_folder(Path(ref)):
        return load(ref, trust_plugins=trust_plugins)
    try:
        return load_hf(ref)
    except HarnessError:
        raise
    except Exception as exc:  # a damaged folder: the libraries' own errors, in one paragraph
        raise HarnessError(f"{ref}: the Hub-layout folder could not be loaded ({type(exc).__name__}: "
                           f"{shorten(str(exc))}). Export it again with `harness export RUN_ID "
                           f"--format hf --out DIR`.") from None


def load_hf(ref: str | Path) -> Any:
    """A :class:`~harness.run.trained.Trained` from a folder (or Hub repo) in the Hub layout;
    every weight loaded strictly."""
    from harness.data.tasks import TaskInfo
    from harness.data.vocab import Vocab
    from harness.run.trained import Trained

    path = Path(ref)
    if path.is_dir() and not is_hub_folder(path):
        raise HarnessError(f"{path} holds no model in the Hub layout written by the harness "
                           f"({CONFIG_FILE} with format {FORMAT!r}); write one with "
                           f"`harness export RUN_ID --format hf --out DIR`.")
    with contextlib.redirect_stdout(io.StringIO()):  # the mixin prints "Loading weights from ..."
        hub = HubModel.from_pretrained(str(ref), strict=True)
    meta = hub.harness_meta
    from harness.run.saved import recorded, saved_tokenizer

    tokenizer_json = saved_tokenizer(path, meta) if path.is_dir() else None
    if tokenizer_json is not None and "harness_symbols" in tokenizer_json[:40]:
        tokenizer_json = None  # a symbol task's vocabulary, which model.json holds too
    return Trained(hub.model.eval(), meta["config"], TaskInfo.from_record(meta["info"]),
                   Vocab(tuple(meta["symbols"])), meta["task_kind"], str(ref), recorded(meta), tokenizer_json)

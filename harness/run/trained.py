"""Using what a run trained: its final weights kept, loaded, sampled and exported.

**Kept.** A run with ``train.save_model`` (the default) writes its final weights when it
finishes, next to its checkpoints: ``<store>/checkpoints/<run_id>/model.safetensors`` and
``model.json`` (the resolved config, what the model learned about its task: batch format,
vocabulary size, longest input, classes; and the vocabulary's symbols). An exported folder
(``harness export RUN_ID --out DIR``) holds the same two files, so ``harness.load_model(DIR)``
works without the store. A run without final weights (stopped before its end) loads from
its newest checkpoint instead. A run that reads text through a tokenizer (a corpus run) also
keeps it there as ``tokenizer.json``, and so does its exported folder: text is read with the
tokenizer the run trained with, never with whatever its corpus folder holds later
(:mod:`harness.run.identity`). ``model.json`` keeps every field of the task's info
(:meth:`~harness.data.tasks.TaskInfo.record`: the document token of ``documents: separate``,
a task's hints such as ``two_tower``): whatever changes what the model computes is saved
with it and built again from it.

**Loaded.** :func:`load` plans the recorded config against the installed plugins, builds
the model and loads the weights (safetensors: no pickle; a checkpoint: ``torch.load(...,
weights_only=True)``).

**Sampled.** :func:`generate` continues a prompt through the model's own decoding path: a
model with ``new_cache()`` reads the prompt once and then one token per step through its
cache (the KV cache of attention, the state of a recurrent mixer: what ``harness bench
decode`` times); a model without one recomputes the prefix per token. ``temperature=0`` is
greedy; otherwise the next token is drawn from ``softmax(logits / temperature)`` restricted
to the ``top_k`` most likely tokens and then to the smallest set whose probability reaches
``top_p``, with a generator seeded by ``seed``. Generation stops at EOS or after
``max_new_tokens``. An encoder-decoder (``seq2seq`` format) run decodes greedily through
its ``greedy_decode``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.data.corpus import TOKENIZER_FILE
from harness.data.tasks import TaskInfo
from harness.data.vocab import BOS, EOS, SEP, Vocab
from harness.errors import ConfigError, HarnessError, shorten
from harness.run import checkpoint, exported, identity
from harness.run.saved import info_of, meta_of, recorded, saved_tokenizer, tokenizer_of
from harness.runtime import paths

WEIGHTS = "model.safetensors"
META = "model.json"


@dataclass
class Trained:
    """A trained model ready to use: the module (in eval mode), its resolved config, what it
    learned about its task and the task's vocabulary."""

    model: Any
    config: dict[str, Any]
    info: TaskInfo
    vocab: Vocab
    task_kind: str
    source: str  # where the weights came from
    #: what the run trained on (harness.run.identity): what its data is compared with
    identity: dict[str, str] = field(default_factory=dict)
    #: the run's tokenizer as saved beside its weights (JSON), or None: read from its task
    tokenizer_json: str | None = None


def write_weights(folder: Path, model: Any, meta: dict[str, Any], tokenizer_json: str | None = None) -> None:
    """``model.safetensors`` (shared tensors stored once), ``model.json`` and, for a run that
    reads text, ``tokenizer.json`` in ``folder``."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    with paths.atomic_target(folder / WEIGHTS) as tmp:  # the mode model.json gets, not 0600
        save_model(_plain(model), str(tmp))
    if tokenizer_json is not None:
        paths.write_atomic(folder / TOKENIZER_FILE, tokenizer_json.encode("utf-8"), fsync=False)
    paths.write_atomic(folder / META, json.dumps(meta, indent=1, default=str).encode(), fsync=False)


def _plain(model: Any) -> Any:
    """The module itself, not a ``torch.compile`` wrapper (the state dict is the same)."""
    return getattr(model, "_orig_mod", model)


def save_final(run_id: str, built: Any, p: Any, logged: dict[str, Any]) -> None:
    task = built.task
    tokenizer = getattr(task, "tokenizer", None)
    meta = meta_of(logged, task.task_kind, built.info, task.vocab.symbols, identity.of_task(task))
    write_weights(checkpoint.folder(run_id), built.model, meta,
                  None if tokenizer is None else str(tokenizer.to_json()))


# -- loading ----------------------------------------------------------------------------------
def _build(meta: dict[str, Any], *, check: Any = None) -> tuple[Any, TaskInfo]:
    """The model ``meta`` describes; ``check(build)``, when given, is called with a function
    that builds it, before it is built for real (an exported folder's checks)."""
    from harness.config import parse_run_config
    from harness.run.build import build_model_from
    from harness.run.plan import load_registry, plan

    data = dict(meta["config"])
    data["tracking"] = {k: v for k, v in (data.get("tracking") or {}).items() if k != "uri"}
    cfg = parse_run_config(data, "the trained model's config")
    p = plan(cfg, load_registry(cfg, None))
    info = info_of(meta["info"], p)
    if check is not None:
        check(lambda: build_model_from(p.parts, info))
    return build_model_from(p.parts, info), info


def _from_folder(folder: Path, source: str, trust_plugins: bool = True) -> Trained:
    """An exported folder's model, checked first (:mod:`harness.run.exported`); the run's own
    folder in the store is the user's and trusted."""
    from safetensors.torch import load_model

    meta = exported.read_meta(folder, META)
    exported.check_trusted(meta, folder, trust_plugins)
    header = exported.weights_header(folder, WEIGHTS)
    tokenizer_json = saved_tokenizer(folder, meta)
    model, info = _build(meta, check=lambda build: exported.check_fits(folder, WEIGHTS, header, build))
    try:
        load_model(model, str(folder / WEIGHTS))
    except Exception as exc:  # safetensors' and torch's errors: the weights do not fit
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise exported.DamagedExport(f"{folder / WEIGHTS}: the weights do not load into the model "
                                     f"model.json describes ({first[:300]}). Export the run again.") from None
    model.eval()
    return Trained(model, meta["config"], info, Vocab(tuple(meta["symbols"])), meta["task_kind"], source,
                   recorded(meta), tokenizer_json)


def _from_checkpoint(path: Path, run_id: str) -> Trained:
    """The model of a run without final weights, from its newest checkpoint (its config in the
    checkpoint; the task built again for its vocabulary and sizes)."""
    from harness.config import parse_run_config
    from harness.run.build import build_task, task_info
    from harness.run.plan import load_registry, plan

    state = checkpoint.read(path)
    config = json.loads(state["harness"]["config"])
    data = dict(config)
    data["tracking"] = {k: v for k, v in (data.get("tracking") or {}).items() if k != "uri"}
    cfg = parse_run_config(data, f"the config in checkpoint {path}")
    p = plan(cfg, load_registry(cfg, None))
    task = build_task(p, seed=cfg.train.data_seed)
    before = state["harness"].get("data") or identity.recorded_by_run(run_id)
    now = identity.of_task(task)
    identity.check(before, now, what=f"run {run_id} (no final weights: its checkpoint {path.name}, "
                   f"with its task built again)", fix=identity.FIX_DATA, data=False)
    info = task_info(p, task)
    meta = meta_of(config, task.task_kind, info, task.vocab.symbols, now)
    model, info = _build(meta)
    weights = {k.removeprefix("model."): v for k, v in state["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(weights)
    model.eval()
    tokenizer = getattr(task, "tokenizer", None)
    return Trained(model, config, info, task.vocab, task.task_kind, str(path), now,
                   None if tokenizer is None else str(tokenizer.to_json()))


def load(ref: str | Path, *, trust_plugins: bool = False) -> Trained:
    """A trained model from an exported folder or a run id (its final weights, else its newest
    checkpoint). An exported folder that names plugin files loads only with
    ``trust_plugins=True`` (:mod:`harness.run.exported`). Every failure is a HarnessError."""
    try:
        return _load(ref, trust_plugins)
    except HarnessError:
        raise
    except MemoryError:
        raise HarnessError(f"{shorten(str(ref), 120)}: the model does not fit in memory.") from None
    except Exception as exc:  # a library's error on a damaged file: still one paragraph
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise HarnessError(f"{shorten(str(ref), 120)} cannot be loaded ({type(exc).__name__}: "
                           f"{shorten(first, 300)}).") from None


def _load(ref: str | Path, trust_plugins: bool) -> Trained:
    path = Path(ref)
    try:
        is_dir = path.is_dir()
    except OSError:  # a name too long for the file system: not a folder
        is_dir = False
    if is_dir:
        if not (path / WEIGHTS).exists() or not (path / META).exists():
            raise HarnessError(f"{path} holds no exported model ({WEIGHTS} and {META}); export one "
                               f"with `harness export RUN_ID --out DIR`.")
        return _from_folder(path, str(path), trust_plugins)
    run_id = str(ref)
    root = checkpoint.folder(run_id)
    if (root / WEIGHTS).is_file() and (root / META).is_file():
        return _from_folder(root, f"run {run_id}")
    latest = checkpoint.latest(root)
    if latest is not None:
        return _from_checkpoint(latest, run_id)
    raise HarnessError(
        f"no trained weights for {run_id!r}: it is not a folder, and the store "
        f"({root.parent}) has no weights or checkpoint of a run with that id (runs keep their "
        f"final weights unless train.save_model is false; pass an exported folder or a run id)."
    )


def export(run_id: str, out: str | Path) -> Path:
    """Copy a run's weights and config into a new folder ``out`` (refused if it exists)."""
    target = paths.new_folder(out, "--out")
    trained = load(run_id)
    tokenizer = tokenizer_of(trained)  # a run recorded before it kept one: its task's, checked
    meta = meta_of(trained.config, trained.task_kind, trained.info, trained.vocab.symbols,
                   {**trained.identity, **({"tokenizer_sha256": identity.digest(tokenizer.to_json()),
                                            "tokenizer": str(tokenizer.name)} if tokenizer else {})},
                   run_id=run_id)
    try:
        with paths.temp_folder(target, "export") as tmp:
            write_weights(tmp, trained.model, meta, None if tokenizer is None else str(tokenizer.to_json()))
            (tmp / paths.MARK).unlink()
            os.rename(tmp, target)
    except OSError as exc:
        raise HarnessError(f"--out {target}: cannot be written ({exc.strerror or exc}). Pick a "
                           f"folder in a place you can write.") from None
    return target


# -- generating -------------------------------------------------------------------------------
def encode(vocab: Vocab, text: str) -> list[int]:
    """A prompt in the vocabulary's symbols: whitespace-separated symbols, or characters when
    every symbol is one character (a character-level vocabulary)."""
    custom = getattr(vocab, "encode", None)
    if callable(custom):
        return list(custom(text))
    ids = {s: vocab.first_symbol + i for i, s in enumerate(vocab.symbols)}
    chars = all(len(s) == 1 for s in vocab.symbols)
    pieces = list(text) if chars and " " in ids else (text.split() if not chars else list(text.replace(" ", "")))
    unknown = [s for s in pieces if s not in ids]
    if unknown:
        shown = ", ".join(repr(s) for s in list(vocab.symbols)[:12])
        raise ConfigError(
            f"--prompt: {unknown[0]!r} is not in the run's vocabulary ({len(vocab.symbols)} symbols: "
            f"{shown}{' ...' if len(vocab.symbols) > 12 else ''}); write the prompt in those symbols"
            f"{', separated by spaces' if not chars else ''}."
        )
    if not pieces:
        raise ConfigError("--prompt is empty; give at least one symbol of the run's vocabulary.")
    return [ids[s] for s in pieces]


def decode(vocab: Vocab, ids: list[int]) -> str:
    chars = all(len(s) == 1 for s in vocab.symbols)
    return vocab.decode([i for i in ids if i >= vocab.first_symbol], sep="" if chars else " ")


def next_token(logits: Any, temperature: float, top_k: int | None, top_p: float | None,
               generator: Any) -> int:
    """The next token from one row of logits (see the module for the rule)."""
    import torch

    if temperature == 0:
        return int(logits.argmax())
    scaled = logits.double() / temperature
    if top_k is not None and top_k < scaled.numel():
        kth = scaled.topk(top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(-1)
    if top_p is not None and top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass of the more likely tokens
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[order[before < top_p]] = True
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    return int(torch.multinomial(probs.float(), 1, generator=generator))


#: Sampling temperatures accepted besides 0 (greedy).
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 1e3
#: Seeds accepted by ``--seed`` (torch's generator takes 64-bit seeds).
MAX_SEED = 2**63 - 1


def check_seed(seed: int) -> None:
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed must be from 0 to 2^63-1, got {shorten(str(seed), 40)}.")


def check_generates(trained: Trained) -> None:
    """Refuse a run that does not generate tokens (a classifier), before its prompt is read."""
    if trained.info.format not in ("lm", "seq2seq"):
        raise HarnessError(
            f"generate needs a language-model or encoder-decoder run; this one trained a "
            f"{trained.task_kind} task in the {trained.info.format} format (it predicts labels, not "
            f"tokens). Evaluate it with its study or `harness train` instead."
        )


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be at least 1, got {max_new_tokens}.")
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):
        raise ConfigError(f"--temperature must be 0 (greedy) or from {MIN_TEMPERATURE:g} to "
                          f"{MAX_TEMPERATURE:g}, got {temperature:g} (below {MIN_TEMPERATURE:g} "
                          f"sampling is greedy in all but name, and its arithmetic overflows).")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"--top-k must be at least 1, got {top_k}.")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"--top-p must be in (0, 1], got {top_p}.")


def generate(trained: Trained, prompt: list[int], *, max_new_tokens: int = 32, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int = 0,
             use_cache: bool = True) -> list[int]:
    """New token ids after ``prompt`` (ids, without the separator a seq2seq task adds)."""
    import torch

    check_sampling(max_new_tokens, temperature, top_k, top_p)
    check_seed(seed)
    check_generates(trained)
    fmt, model = trained.info.format, trained.model
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if fmt == "seq2seq":
            if temperature != 0:
                raise ConfigError("--temperature: an encoder-decoder run decodes greedily (its "
                                  "greedy_decode); use --temperature 0.")
            src = torch.tensor([prompt], device=device)
            return _until_eos(model.greedy_decode(src, src == 0, max_new_tokens)[0].tolist())
        context = list(prompt) + ([SEP] if trained.task_kind == "seq2seq" else [])
        if trained.task_kind == "lm" and not context:
            context = [BOS]
        out: list[int] = []
        for nxt in continuation(model, context, temperature, top_k, top_p, generator, use_cache):
            out.append(nxt)
            if nxt == EOS or len(out) == max_new_tokens:
                break
        return _until_eos(out)


def continuation(model: Any, context: list[int], temperature: float, top_k: int | None,
                 top_p: float | None, generator: Any, use_cache: bool = True) -> Iterator[int]:
    """The tokens a language model writes after ``context``, one at a time, for as long as
    the caller reads: through the model's cache when it has one (``new_cache``), else by
    running the whole sequence again. Call under ``torch.no_grad()``; the caller stops."""
    import torch

    device = next(model.parameters()).device
    tokens = torch.tensor([context], device=device)
    cached = use_cache and hasattr(model, "new_cache")
    cache = model.new_cache() if cached else None
    logits = model(tokens, cache=cache) if cached else model(tokens)
    while True:
        nxt = next_token(logits[0, -1], temperature, top_k, top_p, generator)
        yield nxt
        step = torch.tensor([[nxt]], device=device)
        if cached:
            logits = model(step, cache=cache)
        else:
            tokens = torch.cat([tokens, step], dim=1)
            logits = model(tokens)


def _until_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS)] if EOS in ids else ids

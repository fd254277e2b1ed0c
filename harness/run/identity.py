"""A run's result may only be computed with what the run trained on.

**What is recorded.** When a run starts, the identity of what its task read
(:func:`of_task`): ``vocab_sha256`` (the SHA-256 of its vocabulary's symbols, one a line),
``tokenizer_sha256`` and ``tokenizer`` (a task that reads text: the SHA-256 of its
tokenizer's JSON, and its name), and what the task itself says
(:meth:`harness.data.tasks.Task.data_identity`: a prepared corpus's manifest SHA-256 as
``data_sha256`` and its folder as ``data``). It goes into the run's tag
``harness.data_identity`` (JSON), every checkpoint and ``model.json``; a run that reads text
also keeps its tokenizer beside its final weights (``tokenizer.json``), and so does every
exported folder, so that scoring, generating and exporting never need the corpus again.

**What is checked.** Wherever a result is computed again from the run's data after the fact,
from the task built anew (the corpus folder as it is *now*): ``harness eval`` and lm-eval's
``harness`` model, ``harness generate``, ``harness.load_model`` of a run that has only
checkpoints, ``harness export``, ``harness train --resume`` and ``--from-run``. What the task
holds now is compared with what the run recorded (:func:`check`); a difference is a
:class:`DataChanged` error (exit 2) that names both and the fix. A run recorded before these
identities existed is compared by what it has: the vocabulary in its ``model.json``, the
12-digit manifest SHA-256 in its ``harness.data`` tag.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from harness.errors import ConfigError
from harness.keys import Tag

#: What a check compares, in this order (each where both sides have it).
KEYS = ("tokenizer_sha256", "vocab_sha256", "data_sha256")
#: The prefix of a SHA-256 enough to tell two files apart in a message.
SHOWN = 12
_MANIFEST_IN_SUMMARY = re.compile(r"manifest sha256 ([0-9a-f]{12,64})")


class DataChanged(ConfigError):
    """What a run trained on has changed since the run: a result computed now would be wrong."""


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def vocab_digest(symbols: Iterable[str]) -> str:
    return digest("\n".join(symbols))


def of_task(task: Any) -> dict[str, str]:
    """The identity of what ``task`` reads (see the module)."""
    out = {"vocab_sha256": vocab_digest(task.vocab.symbols)}
    tokenizer = getattr(task, "tokenizer", None)
    if tokenizer is not None:
        out["tokenizer_sha256"] = digest(tokenizer.to_json())
        out["tokenizer"] = str(tokenizer.name)
    out.update({k: str(v) for k, v in getattr(task, "data_identity", dict)().items()})
    return out


def from_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The identity a run's tags record: ``harness.data_identity``, else the manifest digest
    in its ``harness.data`` summary (a run recorded before the identity tag)."""
    text = tags.get(Tag.DATA_IDENTITY)
    if text:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            return {str(k): str(v) for k, v in data.items()}
    found = _MANIFEST_IN_SUMMARY.search(tags.get(Tag.DATA) or "")
    return {"data_sha256": found.group(1), "data": "its prepared corpus"} if found else {}


def recorded_by_run(run_id: str, tracking_uri: str | None = None) -> dict[str, str]:
    """The identity a run's tags record in the store (``tracking_uri``, else the default one);
    empty when the run or the store cannot be read."""
    try:
        from harness.store.tracking import Tracker

        return from_tags(Tracker(tracking_uri).client.get_run(run_id).data.tags)
    except Exception:  # another store, a folder away from its store: nothing to compare with
        return {}


def _same(a: str, b: str) -> bool:
    """Digests that agree (a recorded 12-digit prefix agrees with the whole digest)."""
    return a.startswith(b) or b.startswith(a) if min(len(a), len(b)) >= SHOWN else a == b


def differences(recorded: Mapping[str, str], now: Mapping[str, str],
                keys: Iterable[str] = KEYS) -> list[str]:
    """The keys among ``keys`` that both sides have and that differ."""
    return [k for k in keys if recorded.get(k) and now.get(k) and not _same(recorded[k], now[k])]


def describe(identity: Mapping[str, str]) -> str:
    """An identity in words: ``tokenizer chars (sha256 1a2b3c4d5e6f), vocabulary of ...``."""
    parts = []
    if identity.get("tokenizer_sha256"):
        parts.append(f"tokenizer {identity.get('tokenizer', '')} (sha256 "
                     f"{identity['tokenizer_sha256'][:SHOWN]})".replace("tokenizer  (", "tokenizer ("))
    if identity.get("vocab_sha256"):
        parts.append(f"vocabulary sha256 {identity['vocab_sha256'][:SHOWN]}")
    if identity.get("data_sha256"):
        parts.append(f"{identity.get('data') or 'data'} with manifest sha256 {identity['data_sha256'][:SHOWN]}")
    return ", ".join(parts) or "nothing recorded"


def check(recorded: Mapping[str, str], now: Mapping[str, str], *, what: str, fix: str,
          data: bool = True) -> None:
    """Refuse (:class:`DataChanged`) when what a run recorded and what its task holds now
    differ (compared where both have a digest). ``data=False``: a use that reads text through
    the run's tokenizer only (scoring, generating, loading): the tokenizer and vocabulary are
    compared, and the data only for a run that recorded neither (its manifest's digest is all
    it has)."""
    keys: tuple[str, ...] = KEYS
    if not data:
        keys = ("tokenizer_sha256", "vocab_sha256")
        if not any(recorded.get(k) for k in keys):
            keys = ("data_sha256",)
    changed = differences(recorded, now, keys)
    if not changed:
        return
    names = {"tokenizer_sha256": "tokenizer", "vocab_sha256": "vocabulary", "data_sha256": "data"}
    raise DataChanged(
        f"{what}: the run trained with {describe(recorded)}, but its task now reads "
        f"{describe(now)}: the {' and '.join(names[k] for k in changed)} changed since the run "
        f"(the corpus was prepared again, or its files replaced), so token ids no longer mean "
        f"what they meant in training and a result computed now would be silently wrong. {fix}")


#: The fix of a run whose corpus changed, for a use that needs only its tokenizer.
FIX_TOKENIZER = ("Put back the folder the run trained on (prepare it again with the same sources "
                 "and options), or use the run's own tokenizer: runs keep it beside their final "
                 "weights (tokenizer.json), and `harness export RUN_ID --out DIR` carries it.")
#: The fix of a run whose data changed, for a use that reads the data itself.
FIX_DATA = ("Put back the folder the run trained on (prepare it again with the same sources and "
            "options), or train a new run on the data as it is now.")

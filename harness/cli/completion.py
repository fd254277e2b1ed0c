"""Shell completion for ``harness``: commands, options, plugin names, study files and names.

``harness completion bash`` (or ``zsh``) prints a small script that asks the harness itself
for the candidates of the word being completed (``harness completion --complete WORDS...``),
so commands and options always match the installed version. An argument says what it
completes with :func:`hint`; plugin names come from the cached listing (:mod:`harness.registry.listing`,
no plugin imported when the cache is fresh), study names from the default Optuna storage (or
``--storage``), opened read-only. Only argparse is imported here.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, TypeVar

A = TypeVar("A", bound=argparse.Action)

#: What an argument completes with: a file type, a plugin kind or a study name.
KINDS = ("yaml", "py", "study", "plugin:attention", "plugin:mixer", "plugin:position",
         "plugin:model", "plugin:task")


def hint(action: A, kind: str) -> A:
    """Mark an argument as completing with ``kind`` (one of :data:`KINDS`)."""
    assert kind in KINDS, kind
    action.completion = kind  # type: ignore[attr-defined]
    return action


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and action.nargs != argparse.REMAINDER


def complete(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """Candidates for the last of ``words`` (the command line after ``harness``, the word
    being completed last, empty when a new word starts)."""
    *done, current = words or [""]
    p, pending, positional, seen = parser, None, 0, {}
    for word in done:
        if pending is not None and not word.startswith("-"):
            seen[pending.dest] = word
            if pending.nargs not in ("+", "*"):
                pending = None
            continue
        pending = None
        if word.startswith("-"):
            action = p._option_string_actions.get(word.split("=", 1)[0])
            if action is not None and _takes_value(action) and "=" not in word:
                pending = action
            continue
        sub = _subcommands(p)
        if sub is not None and word in sub.choices:
            p, positional = sub.choices[word], 0
        else:
            positional += 1
    if pending is not None and not current.startswith("-"):
        return _values(pending, current, seen)
    if current.startswith("-"):
        return sorted(o for o, a in p._option_string_actions.items()
                      if o.startswith(current) and a.help != argparse.SUPPRESS)
    sub = _subcommands(p)
    if sub is not None:
        return sorted(c for c in sub.choices if c.startswith(current))
    args = [a for a in p._actions if not a.option_strings]
    return _values(args[positional], current, seen) if positional < len(args) else []


def _values(action: argparse.Action, current: str, seen: dict[str, Any]) -> list[str]:
    if action.choices is not None:
        return sorted(str(c) for c in action.choices if str(c).startswith(current))
    kind = getattr(action, "completion", None)
    if kind in ("yaml", "py"):
        return files(current, (".yaml", ".yml") if kind == "yaml" else (".py",))
    if kind == "study":
        return [n for n in study_names(seen.get("storage")) if n.startswith(current)]
    if kind and kind.startswith("plugin:"):
        return [n for n in plugin_names(kind.split(":", 1)[1]) if n.startswith(current)]
    return []


def files(current: str, suffixes: tuple[str, ...]) -> list[str]:
    """Folders and files with one of ``suffixes`` that start with ``current``."""
    folder, _, stem = current.rpartition("/")
    base = Path(os.path.expanduser(folder or "."))
    prefix = folder + "/" if folder or current.startswith("/") else ""
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    out = []
    for entry in entries:
        if not entry.name.startswith(stem) or (entry.name.startswith(".") and not stem.startswith(".")):
            continue
        if entry.is_dir():
            out.append(f"{prefix}{entry.name}/")
        elif entry.suffix in suffixes:
            out.append(f"{prefix}{entry.name}")
    return out


def plugin_names(kind: str) -> list[str]:
    from harness.registry import listing

    try:
        data = listing.listing()
    except Exception:  # a broken environment: no names rather than a traceback in the shell
        return []
    return sorted(s["name"] for s in data["specs"] if s["kind"] == kind)


def study_names(storage_url: str | None) -> list[str]:
    try:
        from harness.study.storage import open_storage, study_names

        return study_names(open_storage(storage_url, read_only=True))
    except Exception:  # no storage yet, or one that cannot be opened: nothing to offer
        return []


BASH = """\
# harness completion for bash: eval "$(harness completion bash)" in ~/.bashrc
_harness_complete() {
    local IFS=$'\\n'
    COMPREPLY=($(harness completion --complete "${COMP_WORDS[@]:1:$COMP_CWORD}" 2>/dev/null))
    if [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == */ ]]; then
        compopt -o nospace 2>/dev/null
    fi
}
complete -o filenames -F _harness_complete harness
"""

ZSH = """\
#compdef harness
# harness completion for zsh: eval "$(harness completion zsh)" in ~/.zshrc
_harness() {
    local -a candidates
    candidates=("${(@f)$(harness completion --complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
    local -a folders others
    folders=(${(M)candidates:#*/})
    others=(${candidates:#*/})
    others=(${others:#})
    (( ${#folders} )) && compadd -S '' -- "${folders[@]}"
    (( ${#others} )) && compadd -- "${others[@]}"
}
if (( $+functions[compdef] )); then
    compdef _harness harness
else
    autoload -Uz compinit && compinit && compdef _harness harness
fi
"""


def script(shell: str) -> str:
    return BASH if shell == "bash" else ZSH

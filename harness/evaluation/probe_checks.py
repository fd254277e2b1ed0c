"""What ``harness probe`` checks before it loads or scores anything (:mod:`harness.evaluation.probe`):
a grid whose data or logits cannot fit in memory, a second probe under one name, a run that did
not finish (a note); each refusal a :class:`~harness.errors.ConfigError` naming the option."""

from __future__ import annotations

from typing import Any

from harness.errors import ConfigError

#: which option sets each of the task's sizing params in a probe
SIZED_BY = "--lengths sets length and eval_lengths, --num num_val, --depths depths"


def check_data_size(lengths: list[int], num: int) -> None:
    """Refuse, before anything is loaded, a grid whose examples alone cannot fit in RAM (``--num
    1000000000`` or ``--lengths 100000000`` would otherwise run for minutes and then fail)."""
    from harness.run.resources import TOKEN_BYTES, GiB, available_bytes

    room, tokens = available_bytes("cpu"), num * sum(lengths)
    if room is not None and tokens * TOKEN_BYTES > room:
        raise ConfigError(
            f"--num {num:,} examples at --lengths {', '.join(f'{n:,}' for n in lengths)} hold {tokens:,} tokens "
            f"({tokens * TOKEN_BYTES / GiB:,.1f} GiB at {TOKEN_BYTES} bytes a token at least) but "
            f"{room / GiB:,.1f} GiB of RAM is available. Nothing was loaded or logged. Lower --num or "
            f"the longest lengths.")


def check_logits_size(longest: int, batch: int, vocab: int, device: Any) -> None:
    """Refuse a length whose one batch of logits alone cannot fit (the model's own activations
    come on top): a probe that would die out of memory after minutes of work."""
    from harness.run.resources import GiB, available_bytes

    need, room = 4 * batch * longest * vocab, available_bytes(device)
    if room is not None and need > room:
        raise ConfigError(
            f"--lengths {longest:,}: one batch of {batch} examples' logits alone needs {need / GiB:,.1f} GiB "
            f"({longest:,} tokens x {vocab:,} ids x 4 bytes, the model's activations besides) but "
            f"{room / GiB:,.1f} GiB is available. Nothing was scored or logged. Probe shorter lengths "
            f"(or --batch-size 1).")


def check_run(tracker: Any, run_id: str, name: str) -> list[str]:
    """Refuse a second probe under one name (its values would pile up at step 0 and its heatmap
    be replaced without a word); notes on a run that did not finish."""
    run = tracker.client.get_run(run_id)
    prefix = f"probe/{name}/"
    if any(key.startswith(prefix) for key in run.data.metrics):
        raise ConfigError(
            f"--name {name}: run {run_id} already holds a probe named '{name}' (metrics {prefix}...): a "
            f"second one would add values beside its own and replace its heatmap. Give another --name "
            f"(e.g. --name {name}-2), or --no-log to print only.")
    status = run.info.status
    if status == "FINISHED":
        return []
    why = {"RUNNING": "still training, or its process was killed without ending it",
           "FAILED": "its training failed", "KILLED": "its training was stopped"}.get(status, status)
    return [f"note: run {run_id} is {status} ({why}): the probe scores the weights it last saved, "
            f"not a finished model."]

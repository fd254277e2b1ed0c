"""``harness train --from-run RUN_ID``: re-run a recorded run from its MLflow record (its
logged config, seeds and plugins) and say whether the metrics match.

Before training, every version the run recorded (each component's plugin, the harness, torch)
is compared with what is installed now and each difference is named. On CPU with the same
versions a re-run is deterministic and its quality metrics match exactly; cost metrics
(throughput, memory) are measurements of the machine and are not compared.
"""

from __future__ import annotations

import math
import sys
import tempfile
from typing import Any

import yaml

from harness.errors import HarnessError
from harness.keys import Tag
from harness.store.masking import mask_url

#: Metric prefixes that measure the machine, not the model.
#: The costs a re-run must reproduce exactly (the others are times, rates and memory peaks:
#: measurements of the machine and its load, compared by no one).
DETERMINED = ("cost/params", "cost/state_size", "cost/flops_per_token")


def version_differences(tags: dict[str, str], plan_tags: dict[str, str]) -> list[str]:
    """Each recorded version that differs from the installed one, as a phrase."""
    out = []
    for key, recorded in sorted(tags.items()):
        if key.endswith(".version") or key in (Tag.VERSION, Tag.TORCH_VERSION):
            now = plan_tags.get(key)
            if now is not None and str(now) != recorded:
                out.append(f"{key} was {recorded}, now {now}")
    return out


def compared(recorded: dict[str, float], now: dict[str, float]) -> tuple[list[str], list[str]]:
    """(keys that match exactly, 'key recorded -> now' for those that differ)."""
    same, differ = [], []
    for key in sorted(set(recorded) & set(now)):
        if key.startswith("cost/") and key not in DETERMINED:
            continue
        a, b = recorded[key], now[key]
        if a == b or (math.isnan(a) and math.isnan(b)):
            same.append(key)
        else:
            differ.append(f"{key} {a:.6g} -> {b:.6g}")
    return same, differ


def reproduce(run_id: str, tracking_uri: str | None = None, extra_plugins: list[str] | None = None) -> int:
    """Re-run ``run_id``; 0 when every quality metric matches, 1 otherwise."""
    from harness.config import parse_run_config
    from harness.run.pipeline import train
    from harness.run.plan import load_registry, plan
    from harness.run.record import provenance_tags
    from harness.store import tracking

    tracker = tracking.Tracker(tracking_uri)
    try:
        run = tracker.client.get_run(run_id)
    except Exception as exc:  # MlflowException: not found
        raise HarnessError(f"there is no run {run_id} in the tracking store {mask_url(tracker.uri)} "
                           f"({type(exc).__name__}). Pass the --tracking-uri it was recorded in.") from None
    with tempfile.TemporaryDirectory() as folder:
        try:
            path = tracker.client.download_artifacts(run_id, "config.yaml", folder)
        except Exception:
            raise HarnessError(f"run {run_id} has no logged config.yaml, so it cannot be re-run.") from None
        with open(path, encoding="utf-8") as f:
            data: dict[str, Any] = yaml.safe_load(f)
    data["plugins"] = [*data.get("plugins", []), *(extra_plugins or [])]
    data["tracking"] = {**data.get("tracking", {}), "uri": tracker.uri,
                        "run_name": f"rerun of {run_id}"}
    cfg = parse_run_config(data, f"the config of run {run_id}")
    registry = load_registry(cfg, None)
    p = plan(cfg, registry)
    from harness.run import identity
    from harness.run.pipeline import task_identity

    identity.check(identity.from_tags(dict(run.data.tags)), task_identity(p),
                   what=f"run {run_id} cannot be re-run as it was", fix=identity.FIX_DATA)
    for line in version_differences(dict(run.data.tags), provenance_tags(p)):
        print(f"harness: version differs from the recorded run: {line}", file=sys.stderr)
    result = train(cfg, registry=registry, extra_tags={Tag.RERUN_OF: run_id})
    same, differ = compared(dict(run.data.metrics), result.metrics)
    if differ:
        print(f"re-run {result.run_id} of {run_id}: {len(differ)} metric(s) differ, {len(same)} match: "
              + "; ".join(differ))
        return 1
    print(f"re-run {result.run_id} of {run_id}: all {len(same)} quality metrics match exactly")
    return 0

"""Study profiles: one study file, several budgets (``cpu`` for a laptop, ``full`` for a GPU).

A study file may hold ``profiles:``, a mapping from a profile's name to the fields it changes::

    budget: {trials: 12, steps: 3000}
    profiles:
      cpu: {budget: {trials: 3, steps: 400}, task: {params: {length: 32}}}
      full: {}

A profile is merged into the study before it is validated: mappings merge key by key, any
other value (a number, a list such as ``candidates``) replaces the study's. ``harness study
run FILE --profile cpu`` chooses one; without ``--profile`` a file with profiles runs ``full``
where a CUDA device is visible and ``cpu`` otherwise. The study's name gets the profile as a
suffix (``recall_baselines-cpu``), so the two never mix in one store, and its record says
which profile it ran.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

from harness.errors import ConfigError

KEY = "profiles"


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in: mappings key by key, other values replaced."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def default_profile(profiles: dict[str, Any]) -> str:
    """``full`` on a machine with a CUDA device, else ``cpu`` (when the file defines them)."""
    import torch

    wanted = "full" if torch.cuda.is_available() else "cpu"
    return wanted if wanted in profiles else next(iter(profiles))


def apply(data: dict[str, Any], profile: str | None, source: str) -> tuple[dict[str, Any], str | None]:
    """The study data with ``profile`` merged in (and the profiles removed), and the profile
    used (None for a file without profiles)."""
    profiles = data.pop(KEY, None)
    if profiles is None:
        if profile is not None:
            raise ConfigError(f"--profile {profile}: {source} defines no profiles; drop --profile.")
        return data, None
    if not isinstance(profiles, dict) or not all(isinstance(v, dict | type(None)) for v in profiles.values()):
        raise ConfigError(f"{KEY} in {source} must map each profile's name to the fields it changes.")
    chosen = profile or default_profile(profiles)
    if chosen not in profiles:
        close = difflib.get_close_matches(chosen, list(profiles), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"--profile {chosen}: {source} has no such profile.{hint} Its profiles: "
                          f"{', '.join(profiles)}.")
    if KEY in (profiles[chosen] or {}):
        raise ConfigError(f"{KEY}.{chosen} in {source}: a profile cannot define profiles.")
    return merge(data, profiles[chosen] or {}), chosen

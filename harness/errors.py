"""User-facing errors.

Every error a user can fix (a bad config, an unknown name, a broken plugin, an incompatible
pairing) is a :class:`HarnessError`. The CLI prints its message as one paragraph and exits
with code 2, without a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class HarnessError(Exception):
    """An error the user can fix; its message says what is wrong and how to fix it."""

    exit_code = 2


class ConfigError(HarnessError):
    """A run or study configuration is invalid; the message names the field."""


class UnknownNameError(HarnessError):
    """A plugin name (attention, position, model, task) is not registered."""


class PluginError(HarnessError):
    """A plugin is broken: it failed to import, registered bad data, or conflicts."""


class IncompatibleError(HarnessError):
    """A combination of components cannot work together (declared by the plugins)."""

"""Built-in plugins of attention-harness (import name ``harness_plugins``).

Each module is one component and is loaded only through the ``harness`` entry-point group
declared in pyproject.toml, exactly like a third-party plugin.
"""

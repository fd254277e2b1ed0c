"""The README's examples are real: every run config it shows is a valid one, with every
plugin it names registered and every parameter declared."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from harness.config import parse_run_config
from harness.run.plan import load_registry, plan

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
RUN_CONFIGS = [block for block in re.findall(r"```yaml\n(.*?)```", README, re.S)
               if {"task", "model"} <= set(yaml.safe_load(block) or {})]


def test_the_readme_shows_a_run_config():
    assert RUN_CONFIGS, "the README lost its run-config example"


@pytest.mark.parametrize("block", RUN_CONFIGS)
def test_every_run_config_in_the_readme_resolves(block):
    data = yaml.safe_load(block)
    data.pop("plugins", None)  # a local file the reader would write
    config = parse_run_config(data, "README")
    plan(config, load_registry(config, None))

"""Study definitions: the YAML schema, its validation against the registry, the search space.

A study compares candidates (a model with its attention variant and position scheme) on one
task under one protocol::

    name: quickstart
    task: {name: copy, params: {length: 8, vocab: 8}}
    candidates:
      - name: mha_sinusoidal
        model:
          name: transformer
          params: {layers: 1}                  # fixed values, never searched
          search: {d_model: [32, 64]}          # narrows the plugin's declared range
          attention: {name: multi_head}
          position: {name: sinusoidal}
    objective: {metric: acc, length: 16}       # read at evaluation length 16
    search: {lr: {low: 1.0e-4, high: 3.0e-3, log: true}}   # shared by every candidate
    budget: {trials: 4, steps: 300}            # the same for every candidate
    confirm: {seeds: 3, baseline: mha_sinusoidal}

Every hyper-parameter a plugin declares with a range is searched unless the YAML fixes it
(``params``) or switches the declared ranges off (``search_declared: false``); ``search``
replaces a declared range (a list of options, or ``{low, high, log, step}``). The task is
never searched: every candidate sees the same data. Errors name the field
(``candidates[2].model.position.search.base``). A model that declares attention roles may
give a role its own variant (``attention_roles: {cross: {name: additive}}``, as in a run
config); those are fixed choices with fixed params: never searched.

The code is in three modules, re-exported here (the public entry point)::

    harness.study.schema      the YAML schema (pydantic models), parsing and loading a study file
    harness.study.candidates  a candidate's search space: components, ranges, widths to match
    harness.study.space       validation against the registry, trial -> run config, parameter
                              matching, the study's plugin registry
"""

from __future__ import annotations

from harness.study.candidates import (
    CandidateSpace,
    ComponentSpace,
    candidate_space,
    component_space,
    parse_range,
    range_values,
)
from harness.study.schema import (
    COSTS,
    MAXIMIZE,
    MINIMIZE,
    NAME_PATTERN,
    Budget,
    Candidate,
    CandidateModel,
    ConfirmConfig,
    CostObjective,
    Objective,
    PrunerConfig,
    ResumeConfig,
    SamplerConfig,
    SearchComponent,
    Strict,
    StudyConfig,
    StudyTracking,
    format_loc,
    load_study_config,
    parse_study_config,
)
from harness.study.space import (
    TRAIN_PROTOCOL,
    TRAIN_SEARCHABLE,
    StudySpace,
    load_registry,
    validate,
)

__all__ = [
    # harness.study.schema
    "COSTS", "MAXIMIZE", "MINIMIZE", "NAME_PATTERN", "Budget", "Candidate", "CandidateModel",
    "ConfirmConfig", "CostObjective", "Objective", "PrunerConfig", "ResumeConfig",
    "SamplerConfig", "SearchComponent", "Strict", "StudyConfig", "StudyTracking", "format_loc",
    "load_study_config", "parse_study_config",
    # harness.study.candidates
    "CandidateSpace", "ComponentSpace", "candidate_space", "component_space", "parse_range",
    "range_values",
    # harness.study.space
    "TRAIN_PROTOCOL", "TRAIN_SEARCHABLE", "StudySpace", "load_registry", "validate",
]

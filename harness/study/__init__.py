"""Comparison studies: the YAML definition, Optuna orchestration, workers, progress.

One study definition lives in the Optuna storage as several Optuna studies::

    NAME                 the record: config, fingerprint, parent MLflow run id, tracking URI
    NAME/tune/CAND       per candidate: ``budget.trials`` slots to tune it
    NAME/confirm/CAND    per candidate: one slot per confirmation seed

**One Optuna study per candidate**, not one study with the candidate as a dimension: each
candidate gets exactly its own trial budget (a shared sampler would spend trials on the
candidates that look good early), the sampler models one search space at a time (candidates
have different hyper-parameters), and the median pruner compares a trial only with trials of
the same candidate — in a shared study a weaker architecture would be pruned for being
weaker, not for being badly tuned, and would end up with fewer full-length trials.

**Slots.** Creating a study enqueues every trial it will ever run as a WAITING Optuna trial
(``harness.slot`` user attr). A worker only *claims* a WAITING trial (WAITING -> RUNNING,
a row-locked update on PostgreSQL; serialised by a file lock on SQLite) and never creates
one, so several workers on several machines can neither run a slot twice nor exceed a
budget, and a candidate's budget is exactly its slots. A claimed trial records a heartbeat;
a worker that dies leaves it RUNNING without heartbeat, and after ``resume.grace_s`` the next
worker marks it FAIL and Optuna's ``RetryHeartbeatStaleTrialCallback`` re-enqueues the same
configuration as a new WAITING trial (``retry_history`` links the two), up to
``resume.max_retry`` times. The killed trial's MLflow run is ended KILLED with
``harness.interrupted=true`` (:func:`reconcile`).

Confirmation slots of a candidate are claimed only once its tuning slots are all finished;
they re-run its best configuration with fresh seeds.

**The study file.** A study compares candidates (a model with its attention variant and position scheme) on one
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

Modules (this package re-exports nothing: import from the module that owns a name)::

    schema       the YAML schema (pydantic models), parsing and loading a study file
    candidates   a candidate's search space: components, ranges, widths to match
    space        validation against the registry, trial -> run config, parameter matching
    storage      the Optuna storage, the study's record, creating or resuming, claiming, heartbeats
    worker       the worker loop: next slot, one trial, pruning callback, failures
    progress     slots by state, ``harness study status``, reconciling MLflow runs
    cli          ``harness study run | create | status`` and ``harness report``

Import rules: nothing here imports the report package; ``schema`` imports nothing of the
registry (``candidates`` and ``space`` check a study against it).
"""

"""One run, one way through typed stages: config -> plan -> build -> fit -> evaluate -> record.

Modules (this package re-exports nothing: import from the module that owns a name)::

    plan       RunConfig -> Plan: resolve against the registry (specs, parameters, presets, pairings)
    build      Plan -> Built: the task's data and the model
    system     the Lightning system (loss, optimiser, validation per length) and data module
    optim      the optimiser and learning-rate schedules
    fit        Plan, Built -> Fitted: Lightning's fit, with throughput measured
    evaluate   Fitted -> Evaluation: every evaluation length the model can run
    record     tags, metrics and figures of the MLflow run; how an early end is recorded
    pipeline   ``train(config)``: the stages in order, recorded in MLflow

Import rules: nothing here imports the study or report packages; models and their layers come
from plugins, built through the specs they registered.
"""

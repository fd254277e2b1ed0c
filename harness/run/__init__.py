"""One run: config -> plan -> build -> fit -> evaluate -> record.

Modules (this package re-exports nothing: import from the module that owns a name)::

    plan       resolve a run config against the registry: specs, parameters, pairings
    system     the Lightning system (loss, optimiser, validation per length) and data module
    pipeline   ``train(config)``: the whole path of one run, recorded in MLflow

Import rules: nothing here imports the study or report packages; the model and its layers
come from plugins, built through the specs they registered.
"""

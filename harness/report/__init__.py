"""Study reports (``harness report STUDY``): what a study found, in a form people can read and check.

Everything is read back from the two stores — the Optuna storage (slots, values, best
configurations) and MLflow (metrics, curves, attention maps of each run) — so a report can
be rebuilt at any time, by anyone who can reach them. One folder (default
``$HARNESS_HOME/reports/<study>/``), also logged to the study's parent MLflow run under
``report/``:

* ``results.md`` / ``results.html``: the ranked table (mean and 95% bootstrap interval over
  the confirmation seeds, the paired test against the baseline, parameters and cost next to
  quality), the evaluation-length table ("n/a" where a model cannot run), the best
  configuration of each candidate, and every figure;
* ``summary.json``: the same numbers for programs;
* ``learning_curves.png``, ``extrapolation.png``, ``front.png`` (quality versus cost);
* ``optuna/<candidate>_history.png`` and ``_importance.png`` (Optuna's own plots);
* ``attention/``: attention maps of the best attention-based model on a few examples.

Modules (this package re-exports nothing)::

    collect   the numbers, read back from Optuna and MLflow, and their statistics
    figures   the figures (matplotlib, Optuna's plots, attention maps)
    render    blocks as Markdown and HTML, the tables, number formatting
    write     assembling the report folder and logging it to the parent run

Import rules: the report reads the stores through :mod:`harness.study.storage` and
:mod:`harness.study.progress`; it never imports the worker.
"""

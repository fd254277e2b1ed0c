"""Study reports (``harness report STUDY``): what a study found, in a form people can read and check.

Everything is read back from the two stores — the Optuna storage (slots, values, best
configurations) and MLflow (metrics, curves, resolved configurations, attention maps of each
run) — so a report can be rebuilt at any time, by anyone who can reach them. One folder
(default ``$HARNESS_HOME/reports/<study>/``), also logged to the study's parent MLflow run
under ``report/``, in the formats asked for (``--format``, default md, html, json):

* ``results.md`` / ``results.html``: a first line when the seeds cannot resolve anything,
  the verdict in sentences (best group, resolved differences with their effect sizes, the
  seeds that would resolve the rest), the ranked table (every seed's value, the mean and its
  named interval, ranks with ties, the best group in bold, the front's ★), the comparisons
  (effect sizes first, then p-values and their Holm adjustment), parameter counts against
  the target and the fixed hyper-parameters that differ between candidates, the protocol
  and the sources of variance the seeds vary, the evaluation-length table, every figure;
* ``candidates.csv`` and ``seeds.csv`` (``csv``), ``table.tex`` (``latex``: booktabs),
  ``summary.json`` (``json``: the numbers for programs, also ``harness.study_summary``);
* ``seeds.png`` (every seed per candidate), ``learning_curves.png``, ``extrapolation.png``,
  ``front.png``, ``optuna/<candidate>_history.png`` and ``_importance.png`` (importance only
  with enough trials), ``attention/`` (the best attention-based model's maps).

Modules (this package re-exports nothing)::

    collect    the numbers, read back from Optuna and MLflow (CandidateResult, Protocol)
    verdict    their statistics: comparisons, best group, ranks, front, parameter checks
    document   the report as blocks, in order
    render     blocks as Markdown and HTML, the tables, number formatting
    export     CSV, LaTeX and JSON
    figures    the figures (matplotlib, Optuna's plots, attention maps)
    write      assembling the report folder and logging it to the parent run
    notebook   study_runs and study_summary (harness.study_runs, harness.study_summary)
    summary    the parent MLflow run as the study's summary (metrics per candidate, the note)
    scaling    realised compute per run; a scaling study's fits, crossovers, figures, exports
    scaling_fit  the scaling-law numerics (Huber fits, iso-FLOP parabolas, bootstrap)

Import rules: the report reads the stores through :mod:`harness.study.storage` and
:mod:`harness.study.progress`; it never imports the worker. ``verdict``, ``document``,
``render`` and ``export`` never read the stores.
"""

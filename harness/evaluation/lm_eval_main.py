"""``python -m harness.evaluation.lm_eval_main ...``: lm-eval's own command line with the
``harness`` model registered (``--model harness --model_args run=RUN_ID_OR_DIR``).

lm-eval 0.4 finds models only in its own registry (no entry-point group), so a model from
another package must be imported before its command line parses ``--model``: this module
imports :mod:`harness.evaluation.adapter` (which registers it) and hands over to
``lm_eval.__main__.cli_evaluate``. Every lm-eval option works as with ``lm_eval``.
"""

from __future__ import annotations


def main() -> None:
    import sys

    from lm_eval.__main__ import cli_evaluate

    import harness.evaluation.adapter  # noqa: F401  (registers "harness" with lm-eval)
    from harness.errors import HarnessError

    try:
        cli_evaluate()
    except HarnessError as exc:  # the run, its context or its text: one paragraph, exit 2
        print(f"harness: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

"""Judging a trained language-model run the way papers do: EleutherAI's lm-evaluation-harness
driving the run's own model and tokenizer (``text`` for text in and out, ``adapter`` for
lm-eval's ``LM`` interface, ``runner`` for ``harness eval`` and studies, ``cli``); see
docs/evaluation.md."""

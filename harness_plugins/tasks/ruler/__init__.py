"""What the RULER-style tasks (Hsieh et al. 2024, arXiv:2404.06654) share: :mod:`.base`. The
tasks themselves are plugins one file each: ``needle``, ``variable_tracking``, and
``ruler_words`` (``common_words``, ``frequent_words``); docs/long_context.md."""

"""RULER-style long-context tasks (Hsieh et al. 2024, arXiv:2404.06654): needle in a haystack
(``needle``), variable tracking (``variable_tracking``), common and frequent words
(``common_words``, ``frequent_words``). Shared machinery in :mod:`.base`; docs/long_context.md."""

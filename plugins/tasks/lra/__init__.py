"""Shared by the Long Range Arena's real-data tasks (``lra_text``, ``lra_retrieval``,
``lra_image``): the readers of each dataset's release (:mod:`.readers`)."""

"""Shared by the Long Range Arena's tasks: the readers of each dataset's release for
``lra_text``, ``lra_retrieval`` and ``lra_image`` (:mod:`.readers`), and the per-process
memo of generated splits for ``listops`` and ``pathfinder`` (:mod:`.memo`)."""

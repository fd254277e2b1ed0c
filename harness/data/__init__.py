"""The data layer: tasks' base classes and vocabularies (``tasks``), batch formats
(``formats``), tokenizers, prepared corpora read by memory map, and readers of labelled files.
Plain Python and numpy at import (no torch)."""

"""I/O: the live text of model turns, outside history (docs/DESIGN.md, "Live text")."""

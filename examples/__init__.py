"""Examples of toolloop used as a library, each run with one command (see the README)."""

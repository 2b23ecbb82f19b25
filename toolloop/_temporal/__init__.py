"""Wiring shared by the entry points (worker, starter, tests): settings, data converter, worker factory."""

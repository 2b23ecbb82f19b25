"""I/O: demo tools for the bundled business service, registered through the public tool plug-in API."""

from demo.tools.reads import build_demo_registry

__all__ = ["build_demo_registry"]

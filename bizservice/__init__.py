"""I/O: the demo business service (orders, tickets, calendars) over HTTP with SQLite storage and fault switches."""

from bizservice.app import create_app

__all__ = ["create_app"]

"""I/O: the demo business service (orders, tickets, calendars, refunds) over HTTP with SQLite storage, an
idempotency ledger for approved writes, and fault switches."""

from demo.bizservice.app import create_app

__all__ = ["create_app"]

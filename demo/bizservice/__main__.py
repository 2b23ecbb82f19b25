"""Entry point: run the business service with uvicorn (`python -m demo.bizservice --db PATH --port N`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import uvicorn

import toolloop
from demo.bizservice.app import create_app
from demo.bizservice.writes import CLAIM_LEASE_SECONDS
from toolloop.servicekit import FileHolds, PolicyRuleIds, check_verify_key, no_hold

logger = logging.getLogger("bizservice")

APPROVAL_VERIFY_KEY_ENV = "BIZSERVICE_APPROVAL_VERIFY_KEY"
# Decide writes by policy: the policy evaluator's public key, and the policy file whose rules it knows.
POLICY_VERIFY_KEY_ENV = "BIZSERVICE_POLICY_VERIFY_KEY"
POLICY_FILE_ENV = "BIZSERVICE_POLICY_FILE"
HOLD_DIR_ENV = "BIZSERVICE_HOLD_DIR"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m demo.bizservice", description="The demo business service.")
    parser.add_argument("--db", required=True, help="SQLite database file (created and seeded if missing)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8701, help="0 picks a free port (the ready line shows it)")
    parser.add_argument(
        "--admin-token",
        default=os.environ.get("BIZSERVICE_ADMIN_TOKEN"),
        help="enables /admin (default: $BIZSERVICE_ADMIN_TOKEN; without one /admin does not exist)",
    )
    parser.add_argument(
        "--idempotency-retention-seconds",
        type=float,
        default=86400.0,
        help="how long a completed write's idempotency record is kept (default: one day)",
    )
    parser.add_argument(
        "--claim-lease-seconds",
        type=float,
        default=CLAIM_LEASE_SECONDS,
        help="how long an in-flight attempt holds its key before another attempt may take it over",
    )
    return parser.parse_args(argv)


async def _serve(server: uvicorn.Server, host: str) -> None:
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task  # start-up failed (port taken, ...): surface it
            return
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    # Callers wait for this line; it carries the real port when --port 0 was given.
    # Callers wait for this plain line (it carries the real port when --port 0 was given); the logs are JSON.
    print(f"bizservice listening on http://{host}:{port}", file=sys.stderr, flush=True)
    logger.info("listening", extra={"url": f"http://{host}:{port}"})
    await task


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    toolloop.configure_logging("service")
    # The approval channel's public key: the service verifies approvals with it and can sign none.
    verify_key = os.environ.get(APPROVAL_VERIFY_KEY_ENV) or None
    if verify_key is not None:
        try:
            check_verify_key(verify_key)
        except ValueError as exc:
            print(f"error: {APPROVAL_VERIFY_KEY_ENV}: {exc}", file=sys.stderr)
            return 2
    policy_key = os.environ.get(POLICY_VERIFY_KEY_ENV) or None
    policy_file = os.environ.get(POLICY_FILE_ENV) or None
    policy_rules = None
    if policy_key is not None:
        try:
            check_verify_key(policy_key)
        except ValueError as exc:
            print(f"error: {POLICY_VERIFY_KEY_ENV}: {exc}", file=sys.stderr)
            return 2
    if policy_file is not None:
        try:
            policy_rules = PolicyRuleIds(policy_file)  # follows the file as it changes
        except ValueError as exc:  # a PolicyError, in one line
            print(f"error: {POLICY_FILE_ENV}: {exc}", file=sys.stderr)
            return 2
    logger.info("admin token %s", "set" if args.admin_token else "unset")
    logger.info("policy verify key %s", "set: writes are decided by policy" if policy_key else "unset")
    logger.info("approval verify key %s", "set" if verify_key else "unset: every write is refused")
    # Test-bed hold points (toolloop.servicekit.FileHolds): only when a directory is given.
    hold_dir = os.environ.get(HOLD_DIR_ENV) or None
    if hold_dir is not None:
        logger.info("hold points armed by files in %s", hold_dir)
    app = create_app(
        args.db,
        admin_token=args.admin_token or None,
        approval_verify_key=verify_key,
        policy_verify_key=policy_key,
        policy_rules=policy_rules,
        idempotency_retention_seconds=args.idempotency_retention_seconds,
        claim_lease_seconds=args.claim_lease_seconds,
        hold=FileHolds(hold_dir) if hold_dir is not None else no_hold,
    )
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info", access_log=False)
    server = uvicorn.Server(config)
    asyncio.run(_serve(server, args.host))
    return 0


if __name__ == "__main__":
    sys.exit(main())

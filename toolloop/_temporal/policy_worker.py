"""Wiring: the policy evaluator's worker (python worker.py --policy). It serves only decide_by_policy, on its
own task queue, and is the only process given the policy's signing key; model workers name its task queue
(TOOLLOOP_POLICY_TASK_QUEUE) and hold no key of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from temporalio.client import Client
from temporalio.worker import Worker

from toolloop.activities.policy import PolicyActivities, PolicySource


@asynccontextmanager
async def running_policy_worker(
    client: Client,
    source: PolicySource,
    signing_key: str,
    task_queue: str,
    approval_verify_key: str | Iterable[str] | None = None,
) -> AsyncIterator[Worker]:
    """A started policy worker, shut down explicitly on exit. With the approval channel's public key it honours
    the grants people give (docs/POLICIES.md, "Grants")."""
    activities = PolicyActivities(source, signing_key, approval_verify_key)
    # Cedar's evaluation is synchronous: a small pool of its own.
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="policy") as pool:
        worker = Worker(client, task_queue=task_queue, activities=[activities.decide_by_policy], activity_executor=pool)
        async with worker:
            yield worker

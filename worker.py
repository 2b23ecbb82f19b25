"""Entry point: run a worker against TEMPORAL_ADDRESS (real deployments and the local stack)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from toolloop._temporal.settings import Settings
from toolloop._temporal.worker_factory import connect, running_worker


async def main() -> None:
    settings = Settings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    client = await connect(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running_worker(client, settings):
        print(
            f"worker ready task_queue={settings.task_queue} temporal={settings.temporal_address} "
            f"service={settings.service_url} openai={'set' if settings.openai_api_key else 'unset'}",
            flush=True,
        )
        await stop.wait()
    print("worker stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
    sys.stdout.flush()
    sys.stderr.flush()
    # The worker is already shut down; skip interpreter teardown, where temporalio 1.35 can abort
    # with "PyGILState_Release" and turn a clean stop into a crash exit code.
    os._exit(0)

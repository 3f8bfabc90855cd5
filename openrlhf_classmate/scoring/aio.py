"""Running the async scoring API from synchronous code."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion and return its result, from synchronous code.

    With no event loop running in this thread it simply uses ``asyncio.run``. When a loop *is* running (sync code
    called from inside async code, e.g. a Ray async actor), that loop cannot be re-entered, so the coroutine runs on
    a fresh loop in a helper thread and this call blocks until it is done. Async callers should await the ``a*``
    functions instead.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="scoring-run-sync") as pool:
        return pool.submit(asyncio.run, coro).result()

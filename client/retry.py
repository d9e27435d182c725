"""Retries with exponential backoff and jitter, for UNAVAILABLE only: the one status that says "try again"
(queue full, server restarting, a target down). Anything else is the caller's problem and is raised at once."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from typing import Awaitable, Callable, TypeVar

from bertserve.client.errors import ServingError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 3
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    multiplier: float = 2.0

    def backoff_s(self, retry: int) -> float:
        """Full jitter: uniform in [0, cap], so clients that failed together do not retry together."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** retry)
        return random.uniform(0.0, cap)


def call_with_retries(call: Callable[[], T], policy: RetryPolicy) -> T:
    for retry in range(policy.max_retries + 1):
        try:
            return call()
        except ServingError as error:
            if not error.retryable or retry == policy.max_retries:
                raise
            time.sleep(policy.backoff_s(retry))
    raise AssertionError("unreachable: the last attempt returns or raises")


async def acall_with_retries(call: Callable[[], Awaitable[T]], policy: RetryPolicy) -> T:
    for retry in range(policy.max_retries + 1):
        try:
            return await call()
        except ServingError as error:
            if not error.retryable or retry == policy.max_retries:
                raise
            await asyncio.sleep(policy.backoff_s(retry))
    raise AssertionError("unreachable: the last attempt returns or raises")

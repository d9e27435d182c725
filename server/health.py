"""What the health checks say: SERVING only once start-up loaded every model, and never again once the batch
scheduler died, since every batched request would then fail; a load balancer must take the server out."""

from __future__ import annotations

import logging
import threading
from typing import Protocol

log = logging.getLogger("bertserve.server")


class HealthReporter(Protocol):
    """The front ends' health service (grpc.health.v1)."""

    def serving(self) -> None: ...

    def not_serving(self) -> None: ...


class ServingHealth:
    """Joins the two events that decide health, whichever comes first: start-up done, batch scheduler dead."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reporter: HealthReporter | None = None
        self.failure: str | None = None

    def start_serving(self, reporter: HealthReporter) -> None:
        """Start-up is done: SERVING, unless the batch scheduler already died."""
        with self._lock:
            self._reporter = reporter
            if self.failure is None:
                reporter.serving()
            else:
                reporter.not_serving()

    def batch_scheduler_failed(self, reason: str) -> None:
        """From the dying batch thread: NOT_SERVING from now on."""
        with self._lock:
            self.failure = reason
            if self._reporter is not None:
                self._reporter.not_serving()
        log.error("health: NOT_SERVING from now on (%s)", reason)

"""Where a Python server's threads spend their time under load, from stack samples taken inside it.

The GPU machine has no py-spy or perf, and cProfile sees one thread only, while `bertserve serve` works on several
(the front ends' event loop, batch threads, a pool for blocking calls). StackSampler reads every thread's stack
(sys._current_frames) every few milliseconds and counts, per thread, the function on top (its own time, including
C calls made from it: a Session run, a protobuf parse) and every function on the stack (time spent below it).
Samples whose top is a wait (a lock, a selector, an idle pool worker) count as idle. C and Cython code has no
frame of its own: its time shows on the Python function that called it (on the event loop, asyncio's
events.py:_run for gRPC's Cython callbacks). The sampler needs the GIL to take a sample, so a thread that holds it
for long is seen less often than it runs: read the shares as where the time goes, not as exact fractions.

server_profile/sitecustomize.py installs it in a process started with that folder on PYTHONPATH and
BERTSERVE_STACK_SAMPLES set to a folder: SIGUSR1 starts sampling, SIGUSR2 writes <folder>/<pid>.json.
"""

from __future__ import annotations

import collections
import gc
import importlib.abc
import itertools
import json
import os
import signal
import sys
import threading
import time

# Top frames of a thread that waits: condition and event waits, the event loop's selector, an idle pool worker,
# and Thread.run itself, whose target is then C code: gRPC's completion-queue poller.
IDLE = {("threading.py", "wait"), ("threading.py", "_wait_for_tstate_lock"), ("selectors.py", "select"),
        ("thread.py", "_worker"), ("queue.py", "get"), ("connection.py", "poll"), ("threading.py", "run")}
# Frames on every stack of a thread (thread start-up, the event loop's own): left out of the inclusive counts.
FRAMEWORK_FILES = {"threading.py", "base_events.py", "events.py"}
MAX_DEPTH = 60
TOP = 25


def _frames(frame):
    """The frames from `frame` down to the thread's first."""
    while frame is not None:
        yield frame
        frame = frame.f_back


def _stack(frame) -> tuple[tuple[str, str], ...]:
    """(file name, function) from the top of the stack down."""
    return tuple((os.path.basename(f.f_code.co_filename), f.f_code.co_name)
                 for f in itertools.islice(_frames(frame), MAX_DEPTH))


class StackSampler:
    def __init__(self, interval_s: float = 0.005):
        self.interval_s = interval_s
        self.stacks: collections.Counter = collections.Counter()  # (thread name, stack) -> samples
        self.rounds = 0
        self.started = self.stopped = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self.stacks.clear()
        self.rounds, self.started = 0, time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread, self.stopped = None, time.monotonic()

    def _run(self) -> None:
        own = threading.get_ident()
        while not self._stop.wait(self.interval_s):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != own:
                    self.stacks[(names.get(ident, str(ident)), _stack(frame))] += 1
            self.rounds += 1

    def summary(self) -> dict:
        """Per thread group (names without their numbers: the pool's threads together): samples, busy share, and
        the functions most often on top and anywhere on the stack (per cent of the group's busy samples)."""
        groups: dict[str, dict] = {}
        for (name, stack), n in self.stacks.items():
            group = groups.setdefault(name.rstrip("_0123456789") or name, {
                "samples": 0, "busy": 0, "threads": set(), "top": collections.Counter(),
                "inclusive": collections.Counter()})
            group["samples"] += n
            group["threads"].add(name)
            if not stack or stack[0] in IDLE:
                continue
            group["busy"] += n
            group["top"][f"{stack[0][0]}:{stack[0][1]}"] += n
            for place in {f"{f}:{fn}" for f, fn in stack if f not in FRAMEWORK_FILES}:
                group["inclusive"][place] += n
        out = {"seconds": round((self.stopped or time.monotonic()) - self.started, 2), "rounds": self.rounds,
               "interval_s": self.interval_s, "threads": {}}
        for name, g in sorted(groups.items(), key=lambda kv: -kv[1]["busy"]):
            busy = max(g["busy"], 1)
            out["threads"][name] = {
                "threads": len(g["threads"]), "samples": g["samples"],
                "busy_share": round(g["busy"] / g["samples"], 3),
                "top": {k: round(100 * v / busy, 1) for k, v in g["top"].most_common(TOP)},
                "inclusive": {k: round(100 * v / busy, 1) for k, v in g["inclusive"].most_common(TOP)}}
        return out


class _FirstImports(importlib.abc.MetaPathFinder):
    """Where each of WATCHED was first imported from: the GPU machine's Python has JAX, whose garbage-collection
    callback ran on the server's event loop; this names the import that brought it in."""

    WATCHED = ("jax", "torch", "keras")

    def __init__(self):
        self.stacks: dict[str, list[str]] = {}

    def find_spec(self, name, path=None, target=None):  # noqa: ARG002 - the finder protocol's signature
        if name in self.WATCHED and name not in self.stacks:
            self.stacks[name] = [f"{f.f_code.co_filename}:{f.f_lineno}" for f in _frames(sys._getframe(1))
                                 if not f.f_code.co_filename.startswith("<frozen")][:MAX_DEPTH]
        return None  # the import itself goes on as usual


def install(folder: str) -> StackSampler:
    """SIGUSR1 starts sampling; SIGUSR2 stops it and writes <folder>/<pid>.json (with where JAX, PyTorch and Keras
    were first imported from, and the garbage collector's callbacks)."""
    sampler = StackSampler()
    imports = _FirstImports()
    sys.meta_path.insert(0, imports)

    def write(*_) -> None:
        sampler.stop()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{os.getpid()}.json")
        summary = dict(sampler.summary(), first_imports=imports.stacks,
                       gc_callbacks=[getattr(c, "__qualname__", repr(c)) for c in gc.callbacks])
        with open(path + ".partial", "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
        os.replace(path + ".partial", path)  # the reader polls for the name

    signal.signal(signal.SIGUSR1, lambda *_: sampler.start())
    signal.signal(signal.SIGUSR2, write)
    return sampler

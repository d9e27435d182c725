"""Server-side batching with TF Serving's BatchingParameters semantics (SharedBatchScheduler + BatchingSession).

One scheduler owns `num_batch_threads` threads shared by every queue (one queue per model version and signature,
as TF Serving keeps one per servable signature). A queue holds batches in arrival order; only the last one is open.
A request joins the open batch if it has room, else opens a new batch, and is refused UNAVAILABLE when that
would exceed `max_enqueued_batches`. A batch runs when a thread is free and it is full, closed by a newer batch,
or its first request has waited `batch_timeout_micros`. Requests whose deadline passed while queued are answered
DEADLINE_EXCEEDED and left out. Every request was validated before it got here as far as the server can check
(the fused op's rules for token inputs), and a batch that fails anyway, on data only the graph checks (a
tf.Example its model cannot parse), runs its requests again one by one: a batch never fails because of one bad
request. With pad_variable_length_inputs off, a request whose trailing shapes (sequence length) differ
from the open batch it would join is answered FAILED_PRECONDITION with TF Serving's message, as TF Serving fails
such a merged batch; here only the newcomer fails and the batch runs for the others. A request that opens a
batch of its own (empty queue, or no room left in the open batch) runs whatever its shape, since TF Serving only
fails a merge.

Why a Python queue feeding the signature's concrete function rather than TensorFlow's BatchFunction kernel:
bench/serve_overhead.py ("batcher_choice") drives both, same knobs, same tiny model, and the queue is the faster
(the README quotes the figures). The queue also gives what the kernel cannot: validation before joining, gRPC
deadlines, TF Serving's queue-full and padding semantics, and the batch-size metrics. Python per request is an
enqueue and one wake-up of its waiter; the model runs once per batch.

A submitted request is a `Submission`: its pieces and one `notify` callback, run on the batch thread once every
piece is answered. The front ends' event loop submits with `submit_on_loop` (the callback wakes the loop; no
thread waits per request), tests and in-process drivers wait with `wait_for` (a threading.Event).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from typing import Callable, Iterator, Mapping, Protocol

import numpy as np

from bertserve.server.config_files import BatchingOptions
from bertserve.server.errors import (ServingError, deadline_exceeded, failed_precondition, from_exception,
                                     invalid_argument, unavailable)

log = logging.getLogger("bertserve.server")

Tensors = dict[str, np.ndarray]


class BatchObserver(Protocol):
    """Where batch statistics go (the Prometheus metrics in production)."""

    def batch_done(self, model: str, signature: str, rows: int, padded_rows: int) -> None: ...

    def task_dequeued(self, model: str, signature: str, task_rows: int, queued_seconds: float) -> None: ...


class Task:
    """One request (or one piece of a split request) waiting for its rows of a batch's outputs."""

    __slots__ = ("inputs", "size", "deadline", "enqueued_at", "outputs", "error", "abandoned", "submission")

    def __init__(self, inputs: Tensors, size: int, deadline: float | None, submission: "Submission"):
        self.inputs, self.size, self.deadline, self.submission = inputs, size, deadline, submission
        self.enqueued_at = time.monotonic()
        self.outputs: Tensors | None = None
        self.error: ServingError | None = None
        self.abandoned = False

    def finish(self, outputs: Tensors | None = None, error: ServingError | None = None) -> None:
        self.outputs, self.error = outputs, error
        self.submission.piece_done()


class Submission:
    """A request in the queue: its pieces (several if it was split) and who to tell once all are answered.

    `notify` runs on a batch thread, once, after the last piece finished; it must only hand the news over
    (schedule a callback on an event loop), never block. Without one, `answered` (an Event) is set instead.
    """

    __slots__ = ("tasks", "_pending", "_lock", "_notify", "answered")

    def __init__(self, notify: Callable[[], None] | None):
        self.tasks: list[Task] = []
        self._pending = 0
        self._lock = threading.Lock()  # pieces of one request may finish on different batch threads
        self.answered = threading.Event() if notify is None else None
        self._notify = notify or self.answered.set

    def add(self, task: Task) -> None:
        self.tasks.append(task)
        self._pending += 1

    def piece_done(self) -> None:
        with self._lock:
            self._pending -= 1
            last = self._pending == 0
        if last:
            try:
                self._notify()
            except Exception:  # noqa: BLE001 - e.g. the waiter's event loop closed; the batch thread lives on
                log.exception("could not deliver a batch result")

    def abandon(self) -> None:
        """The waiter gave up (deadline, cancelled RPC): pieces still queued are dropped from their batches."""
        for task in self.tasks:
            task.abandoned = True

    def result(self) -> Tensors:
        """The outputs, split pieces joined in order; raises the first piece's error. Only once notified."""
        for task in self.tasks:
            if task.error is not None:
                raise task.error
        if len(self.tasks) == 1:
            return self.tasks[0].outputs
        return {name: np.concatenate([task.outputs[name] for task in self.tasks], axis=0)
                for name in self.tasks[0].outputs}


class _Batch:
    __slots__ = ("tasks", "size", "shape_key", "created")

    def __init__(self, shape_key: tuple):
        self.tasks: list[Task] = []
        self.size = 0
        self.shape_key = shape_key
        self.created = time.monotonic()

    def add(self, task: Task) -> None:
        self.tasks.append(task)
        self.size += task.size


class BatchScheduler:
    """The shared batch thread pool: picks the next ready batch across all queues."""

    def __init__(self, num_threads: int, thread_pool_name: str,
                 on_failure: Callable[[str], None] = lambda reason: None):
        """on_failure(reason) runs once if a batch thread dies (health then stops saying SERVING)."""
        self.condition = threading.Condition()
        self._queues: list[BatchingQueue] = []
        self._next = 0
        self._stopping = False
        self.failure: str | None = None  # why scheduling stopped for good; None while it runs
        self._on_failure = on_failure
        self._threads = [threading.Thread(target=self._work, name=f"{thread_pool_name}_{i}", daemon=True)
                         for i in range(num_threads)]
        for thread in self._threads:
            thread.start()

    def add_queue(self, options: BatchingOptions, run: Callable[[Tensors], Tensors], tensor_names: Mapping[str, str],
                  model: str, signature: str, observer: BatchObserver) -> "BatchingQueue":
        queue = BatchingQueue(self, options, run, tensor_names, model, signature, observer)
        with self.condition:
            self._queues.append(queue)
        return queue

    def remove_queue(self, queue: "BatchingQueue") -> None:
        with self.condition:
            if queue in self._queues:
                self._queues.remove(queue)

    def stop(self) -> None:
        """Runs every queued batch, then ends the threads."""
        with self.condition:
            self._stopping = True
            self.condition.notify_all()
        for thread in self._threads:
            thread.join()

    def _pick(self, now: float) -> tuple["BatchingQueue", _Batch] | float | None:
        """A ready (queue, batch), else the earliest time one becomes ready (None: nothing queued)."""
        wake = None
        count = len(self._queues)
        for offset in range(count):
            queue = self._queues[(self._next + offset) % count]
            if not queue.batches:
                continue
            head = queue.batches[0]
            ready_at = head.created + queue.options.batch_timeout_micros / 1e6
            if (len(queue.batches) > 1 or head.size >= queue.options.execution_limit or now >= ready_at
                    or self._stopping or queue.closing):
                queue.batches.popleft()
                self._next = (self._next + offset + 1) % count
                return queue, head
            wake = ready_at if wake is None else min(wake, ready_at)
        return wake

    def _work(self) -> None:
        try:
            while True:
                batch = None
                with self.condition:
                    while True:
                        picked = self._pick(time.monotonic())
                        if isinstance(picked, tuple):
                            break
                        if picked is None and self._stopping:
                            return
                        self.condition.wait(None if picked is None else max(0.0, picked - time.monotonic()))
                    if any(queue.batches for queue in self._queues):
                        # submit wakes one thread per event; this one is leaving to run a batch, so another idle
                        # thread takes over the timers of what is still queued.
                        self.condition.notify()
                queue, batch = picked
                with _deliveries_held():
                    queue.process(batch)
        except BaseException as exc:  # noqa: BLE001 - a dead batch thread must not leave a scheduler looking alive
            self._fail(f"batch thread {threading.current_thread().name} died: {type(exc).__name__}: {exc}", batch)

    def _fail(self, reason: str, running: "_Batch | None") -> None:
        """Stops scheduling for good: queued and running requests are answered UNAVAILABLE, new ones refused at
        once (BatchingQueue.submit), and on_failure tells health, instead of requests hanging to their deadline."""
        with self.condition:
            first, self.failure = self.failure is None, self.failure or reason
            self._stopping = True
            stranded = [task for queue in self._queues for queued in queue.batches for task in queued.tasks]
            for queue in self._queues:
                queue.batches.clear()
            self.condition.notify_all()
        stranded += [task for task in (running.tasks if running else []) if task.outputs is None and task.error is None]
        if first:  # health first: a client told UNAVAILABLE must find the server no longer SERVING
            log.error("batch scheduler stopped: %s", reason)
            self._on_failure(reason)
        for task in stranded:
            task.finish(error=unavailable(f"batch scheduler stopped: {reason}"))


class BatchingQueue:
    """The batching queue of one servable signature.

    `tensor_names` maps each input alias to its graph tensor name (the SignatureDef's TensorInfo.name), the name
    TF Serving's shape-mismatch error gives.
    """

    def __init__(self, scheduler: BatchScheduler, options: BatchingOptions, run: Callable[[Tensors], Tensors],
                 tensor_names: Mapping[str, str], model: str, signature: str, observer: BatchObserver):
        self.scheduler, self.options, self._run, self._tensor_names = scheduler, options, run, tensor_names
        self.model, self.signature, self._observer = model, signature, observer
        self.batches: collections.deque[_Batch] = collections.deque()
        self.closing = False

    def _shape_key(self, inputs: Tensors) -> tuple:
        if self.options.pad_variable_length_inputs:
            return tuple(sorted((name, array.ndim) for name, array in inputs.items()))
        return tuple(sorted((name, array.shape[1:]) for name, array in inputs.items()))

    def submit(self, inputs: Tensors, size: int, deadline: float | None,
               notify: Callable[[], None] | None = None) -> Submission:
        """Enqueues a validated request; `notify` runs once all of it is answered (see Submission). Raises
        ServingError, at once (UNAVAILABLE) when the queue is full: a full queue never makes a request wait."""
        options = self.options
        if size > options.max_batch_size:
            raise invalid_argument(f"Task size {size} is larger than maximum input batch size {options.max_batch_size}")
        key = self._shape_key(inputs)
        limit = options.execution_limit
        with self.scheduler.condition:
            if self.scheduler.failure is not None:
                raise unavailable(f"batch scheduler stopped: {self.scheduler.failure}")
            if self.closing:
                raise unavailable(f"servable {self.model} is unloading; retry")
            open_batch = self.batches[-1] if self.batches else None
            room = limit - open_batch.size if open_batch is not None else 0
            joins = room > 0 if options.enable_large_batch_splitting else size <= room
            if joins and open_batch.shape_key != key:
                if not options.pad_variable_length_inputs:
                    raise self._shape_mismatch(inputs, open_batch)
                room = 0  # padding on, ranks differ: padding cannot merge them, so start a new batch
            if options.enable_large_batch_splitting:
                first = min(room, size)
                pieces = ([first] if first else []) + _chunks(size - first, limit)
            else:
                pieces = [size]
            new_batches = len(pieces) - (1 if pieces[0] <= room else 0)
            if len(self.batches) + new_batches > options.max_enqueued_batches:
                raise unavailable("The batch scheduling queue to which this task was submitted is full")
            submission, start = Submission(notify), 0
            for piece in pieces:
                sliced = inputs if len(pieces) == 1 else {n: a[start:start + piece] for n, a in inputs.items()}
                task = Task(sliced, piece, deadline, submission)
                start += piece
                if not self.batches or self.batches[-1].shape_key != key or self.batches[-1].size + piece > limit:
                    self.batches.append(_Batch(key))
                self.batches[-1].add(task)
                submission.add(task)
            if new_batches or self.batches[0].size >= limit:
                # A new head batch (its timer starts) or a ready one. A request that joins the head batch without
                # filling it changes nothing a waiting thread acts on: waking the batch threads for it made each
                # request cost two thread wake-ups, each taking the GIL from the event loop.
                self.scheduler.condition.notify()
        return submission

    def _shape_mismatch(self, inputs: Tensors, batch: _Batch) -> ServingError:
        """TF Serving's merge error (BatchingSession::MergeInputTensors), plus the shapes that differ."""
        joined = batch.tasks[0].inputs
        name = next(n for n in sorted(inputs) if inputs[n].shape[1:] != joined[n].shape[1:])
        return failed_precondition(
            f"Tensors with name '{self._tensor_names.get(name, name)}' from different tasks have different shapes "
            f"and padding is turned off. Set pad_variable_length_inputs to true, or ensure that all tensors with the "
            f"same name have equal dimensions starting with the first dim. Input '{name}' of this request has "
            f"shape {list(inputs[name].shape)}; the batch it would join has shape "
            f"{[batch.size, *joined[name].shape[1:]]}.")

    def process(self, batch: _Batch) -> None:
        now = time.monotonic()
        live = []
        for task in batch.tasks:
            self._observer.task_dequeued(self.model, self.signature, task.size, now - task.enqueued_at)
            if task.abandoned or (task.deadline is not None and now >= task.deadline):
                task.finish(error=deadline_exceeded("Request deadline passed while waiting in the batching queue"))
            else:
                live.append(task)
        if live:
            self._run_tasks(live)

    def _run_tasks(self, live: list[Task]) -> None:
        rows = sum(task.size for task in live)
        padded_rows = self._padded_size(rows)
        try:
            merged = self._merge(live, padded_rows - rows)
            outputs = self._run(merged)
            for name, value in outputs.items():
                # The signature cannot be batched: FAILED_PRECONDITION, with TF Serving's texts (batching_session).
                if value.ndim == 0:
                    raise failed_precondition(f"Batched output tensor has 0 dimensions (output '{name}')")
                if value.shape[0] != padded_rows:
                    raise failed_precondition(
                        f"Batched output tensor's 0th dimension does not equal the sum of the 0th dimension sizes "
                        f"of the input tensors (output '{name}' has shape {list(value.shape)}, the batch "
                        f"{padded_rows} rows)")
        except Exception as exc:  # noqa: BLE001 - a failed batch answers each of its requests, never crashes
            error = from_exception(exc)
            if len(live) > 1:
                # The data of one request can fail the whole batch where nothing could check it beforehand (a
                # tf.Example its model cannot parse, a value only the graph refuses): each runs again alone, so
                # only the one at fault fails.
                log.warning("batch of %d rows for %s/%s failed (%s); its %d requests run one by one", rows,
                            self.model, self.signature, error, len(live))
                for task in live:
                    self._run_tasks([task])
                return
            log.error("batch of %d rows for %s/%s failed: %s", rows, self.model, self.signature, error)
            live[0].finish(error=error)
            return
        self._observer.batch_done(self.model, self.signature, rows, padded_rows)
        offset = 0
        for task in live:
            task.finish(outputs={name: value[offset:offset + task.size] for name, value in outputs.items()})
            offset += task.size

    def _padded_size(self, rows: int) -> int:
        """allowed_batch_sizes: round up to the next allowed size (the extra rows are dropped afterwards)."""
        for allowed in self.options.allowed_batch_sizes:
            if allowed >= rows:
                return allowed
        return rows

    def _merge(self, tasks: list[Task], extra_rows: int) -> Tensors:
        merged = {}
        for name in tasks[0].inputs:
            parts = [task.inputs[name] for task in tasks]
            if self.options.pad_variable_length_inputs:
                parts = _pad_to_common_shape(parts)
            merged[name] = _stacked(parts, extra_rows)
        return merged

    def close(self) -> None:
        """Refuses new requests; queued batches run at once. The scheduler forgets the queue when asked."""
        with self.scheduler.condition:
            self.closing = True
            self.scheduler.condition.notify_all()


def requests_held(options: BatchingOptions) -> int:
    """The most requests one queue holds, queued or running (each has at least one row): past this many in flight
    a front end may refuse at once, as the queue would."""
    return options.execution_limit * (options.max_enqueued_batches + options.num_batch_threads)


def _chunks(total: int, limit: int) -> list[int]:
    return [limit] * (total // limit) + ([total % limit] if total % limit else [])


def _stacked(parts: list[np.ndarray], extra_rows: int) -> np.ndarray:
    """The parts one after another along axis 0, then `extra_rows` copies of the first row (the padding to an
    allowed batch size).

    Copied by bytes.join, which keeps the GIL: NumPy's copies drop it around every part of more than 500 elements,
    and a batch thread that drops the GIL waits a switch interval (--gil_switch_interval_micros) for the event loop
    to hand it back. Eight 32x32 int32 parts beside a busy thread: 155 us a merge with np.concatenate, 4.5 with
    this; alone, 4.4 and 1.9."""
    first = parts[0]
    if len(parts) == 1 and not extra_rows:
        return first
    if first.dtype.hasobject or any(part.dtype != first.dtype for part in parts):  # no fixed-size bytes to join
        if extra_rows:
            parts = [*parts, np.repeat(first[:1], extra_rows, axis=0)]
        return np.concatenate(parts, axis=0)
    pieces = [np.ascontiguousarray(part) for part in parts]  # no copy for the contiguous arrays requests decode to
    padding_rows = min(len(first), 1) * extra_rows
    if padding_rows:
        pieces.append(first[:1].tobytes() * extra_rows)
    rows = sum(len(part) for part in parts) + padding_rows
    return np.frombuffer(b"".join(pieces), dtype=first.dtype).reshape((rows, *first.shape[1:]))


def _pad_to_common_shape(parts: list[np.ndarray]) -> list[np.ndarray]:
    """TF Serving's pad_variable_length_inputs: pad every dim but the 0th with the tensor's own first element."""
    target = np.max([p.shape for p in parts], axis=0)
    padded = []
    for part in parts:
        widths = [(0, 0)] + [(0, int(t - s)) for t, s in zip(target[1:], part.shape[1:])]
        if any(w for _, w in widths) and part.size:
            part = np.pad(part, widths, constant_values=part.flat[0])
        padded.append(part)
    return padded


def wait_for(submission: Submission, deadline: float | None) -> Tensors:
    """Blocks this thread until a submission made without `notify` is answered (tests, in-process drivers)."""
    if not submission.answered.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
        submission.abandon()
        raise deadline_exceeded("Deadline exceeded while waiting for the batch to run")
    return submission.result()


_holding = threading.local()  # on a batch thread while it answers a batch: inbox -> callbacks held back


@contextlib.contextmanager
def _deliveries_held() -> Iterator[None]:
    """Around answering one batch: every loop gets its answers in one wake-up when the batch is done."""
    _holding.callbacks = held = {}
    try:
        yield
    finally:
        _holding.callbacks = None
        for inbox, callbacks in held.items():
            inbox.post_all(callbacks)


class _LoopInbox:
    """Answers from batch threads to one event loop, delivered in one loop callback however many arrive together:
    a batch of N requests wakes the loop once, not N times (each wake-up is a syscall and a loop iteration)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[Callable[[], None]] = []

    def post(self, callback: Callable[[], None]) -> None:
        """From any thread: `callback` runs on the loop soon (with the rest of its batch, on a batch thread)."""
        held = getattr(_holding, "callbacks", None)
        if held is not None:
            held.setdefault(self, []).append(callback)
        else:
            self.post_all([callback])

    def post_all(self, callbacks: list[Callable[[], None]]) -> None:
        with self._lock:
            idle = not self._pending  # no drain scheduled yet
            self._pending.extend(callbacks)
        if idle:
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for callback in pending:
            try:
                callback()
            except Exception:  # noqa: BLE001 - one answer's failure must not lose the others of its batch
                log.exception("answering a request failed")


_inboxes: dict[asyncio.AbstractEventLoop, _LoopInbox] = {}


def _inbox(loop: asyncio.AbstractEventLoop) -> _LoopInbox:
    """The loop's inbox; made on the loop's own thread (submit_on_loop), so never twice for one loop."""
    inbox = _inboxes.get(loop)
    if inbox is None:
        inbox = _inboxes[loop] = _LoopInbox(loop)
    return inbox


def submit_on_loop(queue: BatchingQueue, inputs: Tensors, size: int, deadline: float | None,
                   on_done: Callable[[Tensors | None, ServingError | None], None]) -> Callable[[], None]:
    """Submits from the running event loop; `on_done(outputs, error)` runs once, on the loop: the batch's answer,
    or DEADLINE_EXCEEDED when the deadline comes first. No thread is held while the request is queued, and the
    batch thread wakes the loop once per batch (_LoopInbox). Returns `abandon`, for a caller that gives up (the
    client went away): its queued pieces are dropped and on_done is not called. Raises ServingError at once when
    the queue refuses the request."""
    loop = asyncio.get_running_loop()
    inbox = _inbox(loop)
    timer: asyncio.TimerHandle | None = None
    settled = False

    def close() -> bool:  # on the loop; the first of answer, timeout and abandon wins
        nonlocal settled
        if settled:
            return False
        settled = True
        if timer is not None:
            timer.cancel()
        return True

    def settle(error: ServingError | None = None) -> None:
        if not close():
            return
        if error is not None:
            submission.abandon()
            on_done(None, error)
            return
        try:
            outputs = submission.result()
        except ServingError as failed:
            on_done(None, failed)
            return
        on_done(outputs, None)

    def abandon() -> None:
        if close():
            submission.abandon()

    submission = queue.submit(inputs, size, deadline, lambda: inbox.post(settle))
    if deadline is not None:
        timer = loop.call_at(loop.time() + max(0.0, deadline - time.monotonic()),
                             lambda: settle(deadline_exceeded("Deadline exceeded while waiting for the batch to run")))
    return abandon

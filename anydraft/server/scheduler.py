"""Up to ``max_batch`` generations at a time per `Decoder`: a bounded, fair queue feeding
worker threads.

A `Decoder` is CPU-bound and not thread-safe, so each worker thread owns one. Jobs wait in
per-client FIFOs that are served round-robin, so one client sending many requests cannot
starve another, and each client may hold only a share of the waiting room, so one client
cannot fill it either. A worker runs its jobs' generations together in one `Batch`
(continuous batching, issue 21): between two steps it takes waiting jobs while it has free
rows, and a job leaves the batch as soon as its generation ends; each step scores every row's
candidates in one target call where the backend batches (models/batch.py). The worker reports
back to the event loop through the job's asyncio queue; the handler sets `job.cancelled` when
its client goes away, and the decoding loop asks `job.stop_reason` between prompt chunks and
before every step, so the row is free again within one chunk or step.

A worker survives whatever fails in it (issue 61): a step's shared call, making its batch's
rows, reporting a generation's news; the jobs concerned end with `DecodingFailed`, and the
worker goes on. What still kills one (a bug in this file) is recorded for /health (`faults`),
and the jobs it held fail rather than hang.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..planning.settings import SETTINGS

log = logging.getLogger("anydraft.server")

# a client may hold this fraction of the waiting room (at least one slot), so at least this
# many clients can queue at once however hard one of them pushes
FAIR_SHARES = 4


def fair_share(max_queue: int) -> int:
    return max(1, math.ceil(max_queue / FAIR_SHARES))


class QueueFull(Exception):
    def __init__(self, retry_after: int, per_client: bool = False):
        super().__init__(f"server busy: try again in {retry_after} s")
        self.retry_after = retry_after
        self.per_client = per_client  # this client's share is full, not the whole queue


class SchedulerClosed(Exception):
    pass


class NoWorkers(SchedulerClosed):
    """Every worker thread has died (`Scheduler.faults` says why): no job can run any more."""


class DecodingFailed(Exception):
    """A step failed after the request was accepted: the server's fault (500), not the request's.
    Its ``__cause__`` is what failed, so the log line of the 500 carries that traceback."""

    @classmethod
    def of(cls, cause: BaseException) -> DecodingFailed:
        error = cls(f"{type(cause).__name__}: {cause}")
        error.__cause__ = cause  # as `raise ... from cause` chains it: the event carries it
        return error


@dataclass(eq=False)
class Job:
    """One request's generation. ``start(decoder, rows, job)`` runs in a worker thread and
    returns the request's `Generation` (on a row of ``rows``, a `BatchSession`, or on its own
    session when None); what it raises is the request's fault."""

    start: Callable
    loop: asyncio.AbstractEventLoop
    client: str = "-"
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None  # perf_counter time a worker took it
    deadline: float | None = None  # perf_counter time after which the generation stops

    def stop_reason(self) -> str | None:
        """Asked by the decoding loop (worker thread): why to stop now, if at all."""
        if self.cancelled.is_set():
            return "cancelled"
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return "timeout"
        return None

    def emit(self, kind: str, payload=None) -> None:
        """Thread-safe: hand an event to the request handler on the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed (shutdown): nobody is listening
            pass


class Scheduler:
    """``snapshot(decoder)``, where given, is what each worker hands over of its decoder
    between steps (its learned statistics, which its steps change: server/state.py):
    ``snapshots[i]`` is worker i's latest, whole whatever the worker is doing when it is read,
    even if it is stuck in a step that outlived `close`."""

    def __init__(self, decoders: list, max_queue: int, max_per_client: int | None = None,
                 max_batch: int = 1, min_read: int = SETTINGS.min_prefill,
                 snapshot: Callable | None = None):
        if not decoders:
            raise ValueError("need at least one decoder")
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.decoders, self.max_batch, self.min_read = decoders, max_batch, min_read
        self.rows = len(decoders) * max_batch  # generations that can run at once
        self.max_queue = max_queue
        self.max_per_client = fair_share(max_queue) if max_per_client is None else max_per_client
        self._cond = threading.Condition()
        self._queues: OrderedDict[str, deque[Job]] = OrderedDict()
        self._waiting = 0
        self._active = 0
        self._running: dict[Job, str] = {}  # jobs a worker took and has not ended -> its name
        # worker name -> what keeps it from serving (it died, or cannot make its rows)
        self._faults: dict[str, str] = {}
        self._dead: set[str] = set()  # workers whose thread ended on an error
        self._taking = True  # False once draining (`stop_taking`) or closed
        self._closed = False
        self._mean_seconds = 1.0  # running mean of job duration, for Retry-After
        self._snapshot = snapshot
        # taken here, before the workers start: a worker that never steps hands over what it
        # was seeded with
        self.snapshots = [None if snapshot is None else snapshot(dec) for dec in decoders]
        self._threads = [
            threading.Thread(target=self._worker, args=(i, dec), name=f"anydraft-worker-{i}",
                             daemon=True)
            for i, dec in enumerate(decoders)
        ]

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def active(self) -> int:
        return self._active

    @property
    def taking(self) -> bool:
        """Whether `submit` takes new jobs (False while the server drains, and once closed)."""
        return self._taking

    @property
    def faults(self) -> dict[str, str]:
        """Worker name -> what is wrong with it: it died, or it cannot make its batch's rows
        (each job it takes fails until it can). Empty while every worker serves."""
        with self._cond:
            return dict(self._faults)

    @property
    def alive(self) -> int:
        """Workers whose thread has not died (`_died`)."""
        return len(self._threads) - len(self._dead)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop_taking(self) -> None:
        """Refuse new jobs (`SchedulerClosed`); the queued and running ones go on."""
        with self._cond:
            self._taking = False

    def close(self, timeout: float = 5.0) -> None:
        """Stop: every job not yet ended, queued or running, ends now with a `SchedulerClosed`
        error (one log line each: a request cut by the shutdown), without waiting for its
        step; then wait up to ``timeout`` s for each worker to finish its step."""
        with self._cond:
            self._taking, self._closed = False, True
            queued = [job for q in self._queues.values() for job in q]
            running, self._running = list(self._running), {}
            self._queues.clear()
            self._waiting = 0
            self._cond.notify_all()
        now = time.perf_counter()
        for job in queued + running:
            job.cancelled.set()  # the worker ends its row at the next step
            job.emit("error", SchedulerClosed("server is shutting down"))
            where = "while queued" if job in queued else f"after {now - job.enqueued_at:.1f} s"
            log.warning("shutdown cut a request of client %s %s", job.client, where)
        for t in self._threads:
            t.join(timeout)

    @property
    def most_at_once(self) -> int:
        """The most jobs one `submit` can ever queue (on an idle server): the rows, or a
        client's share of the waiting room if larger, within rows plus waiting room."""
        return min(self.rows + self.max_queue, max(self.rows, self.max_per_client))

    def submit(self, *jobs: Job) -> None:
        """Queue ``jobs`` (one client's: the completions of one request) all, or none and raise
        `QueueFull`: more than the free rows, and then either more than ``max_queue`` jobs
        waiting, or more than ``max_per_client`` of them from their client."""
        with self._cond:
            if not self._taking:
                raise SchedulerClosed("server is shutting down")
            if not self.alive:
                raise NoWorkers("no worker is running (the server log says why): restart the server")
            client, n = jobs[0].client, len(jobs)
            queued = len(self._queues.get(client, ()))
            busy = self._waiting + self._active + n > self.rows
            full = self._waiting + self._active + n > self.max_queue + self.rows
            if full or (busy and queued + n > self.max_per_client):
                # jobs ahead of a retry, spread over the rows, at the mean job duration
                ahead = (self._waiting + n) / self.rows
                raise QueueFull(max(1, min(60, math.ceil(ahead * self._mean_seconds))),
                                per_client=not full)
            self._queues.setdefault(client, deque()).extend(jobs)
            self._waiting += n
            self._cond.notify(n)

    def cancel(self, job: Job) -> None:
        """The client is gone: drop ``job`` from the queue, or stop it at its next delta."""
        job.cancelled.set()
        with self._cond:
            q = self._queues.get(job.client)
            if q is not None and job in q:
                q.remove(job)
                self._waiting -= 1
                if not q:
                    del self._queues[job.client]

    def _next_job(self) -> Job:
        client, q = next(iter(self._queues.items()))
        job = q.popleft()
        del self._queues[client]
        if q:  # round-robin: this client goes to the back of the line
            self._queues[client] = q
        self._waiting -= 1
        return job

    def _worker(self, index: int, decoder) -> None:
        """A worker's life: `_serve` until closed. What escapes `_serve` is a bug (it survives
        every failure of a step, of making rows, of a report): the worker is recorded as dead,
        with why (`faults`: /health says degraded), and the jobs it held fail; once no worker
        is left, so do the queued jobs, and `submit` refuses new ones (`NoWorkers`)."""
        try:
            self._serve(index, decoder)
        except BaseException as exc:  # noqa: BLE001 - recorded and logged, never silent
            self._died(exc)

    def _serve(self, index: int, decoder) -> None:
        """Take jobs and step their generations together until closed. Where the batch's rows
        cannot be made, the jobs taken fail and the rows are made again for the next job (a
        worker that cannot allocate waits for work: it does not spin)."""
        from ..decoding import Batch

        name = threading.current_thread().name
        batch, jobs = Batch(self.min_read), {}
        rows = self._new_rows(decoder)  # an exception: they could not be made
        hand_over = self._snapshot is not None
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not batch:
                    self._cond.wait()
                if self._closed:  # `close` ended every job
                    return
                taken = []
                while self._waiting and len(batch) + len(taken) < self.max_batch:
                    taken.append(self._next_job())
                    taken[-1].started_at = time.perf_counter()
                    self._running[taken[-1]] = name
                    self._active += 1
            if taken and isinstance(rows, BaseException):
                rows = self._new_rows(decoder)
            for job in taken:
                if isinstance(rows, BaseException):
                    self._end(job, "error", DecodingFailed.of(rows))
                else:
                    self._begin(decoder, rows, job, batch, jobs)
            if batch and not self._step(batch, jobs):
                rows = None  # the failed batch's rows go before new ones are made
                rows = self._new_rows(decoder)
            hand_over = hand_over and self._hand_over(index, decoder)

    def _new_rows(self, decoder):
        """The rows of this worker's batch (None for a batch of one: it runs on a session of its
        own, `Decoder.generate`'s path), or the exception that making them raised, logged and
        recorded in `faults` until they are made."""
        name = threading.current_thread().name
        try:
            rows = decoder.new_rows(self.max_batch) if self.max_batch > 1 else None
        except BaseException as exc:  # noqa: BLE001 - the jobs fail, not the worker
            traceback.clear_frames(exc.__traceback__)  # what it had made goes now
            log.error("%s could not make its batch's rows: each job it takes fails until it can",
                      name, exc_info=exc)
            with self._cond:
                self._faults[name] = f"cannot make its batch's rows: {type(exc).__name__}: {exc}"
            return exc
        with self._cond:
            self._faults.pop(name, None)
        return rows

    def _step(self, batch, jobs: dict) -> bool:
        """One step of ``batch``, its news reported; False where its shared call failed
        (`_fail_step`; a row's own failure ends that row alone, in the news)."""
        try:
            news = batch.run_once()
        except BaseException as exc:  # noqa: BLE001 - a step must never take the worker down
            # in a frame of its own: this one is in exc's traceback, and its loop's last
            # generation (and that generation's rows) would outlive the step with it
            self._fail_step(exc, batch, jobs)
            return False
        for generation, done in news:
            self._report(generation, done, jobs)
        return True

    def _fail_step(self, exc: BaseException, batch, jobs: dict) -> None:
        """``batch``'s shared call failed with ``exc``: every row of it fails, and the batch
        starts afresh; the generations that had ended before the call (not in the batch any
        more) are reported as they ended. The failure's frames are cleared: they hold the
        failed batch's buffers, which must go before the worker makes new ones (its traceback
        still shows where it failed, in the log line of each job's 500)."""
        traceback.clear_frames(exc.__traceback__)
        batch.clear()
        for generation, job in list(jobs.items()):
            if generation.done:  # finished, or failed alone
                generation.leave()
                self._report(generation, True, jobs)
            else:
                del jobs[generation]
                self._end(job, "error", DecodingFailed.of(exc))

    def _hand_over(self, index: int, decoder) -> bool:
        """Between steps, while nothing changes it: ``snapshot(decoder)`` replaces worker
        ``index``'s last (one reference stored: a reader gets the last one or this one, each
        whole). False where taking it failed (logged once: the last one stands)."""
        try:
            self.snapshots[index] = self._snapshot(decoder)
        except BaseException as exc:  # noqa: BLE001 - the statistics are not worth a worker
            log.error("%s could not take a snapshot of its statistics: its last one stands",
                      threading.current_thread().name, exc_info=exc)
            return False
        return True

    def _died(self, exc: BaseException) -> None:
        """The calling worker's thread ends on ``exc``: recorded, and its jobs fail (and the
        queued ones, if it was the last)."""
        name = threading.current_thread().name
        log.error("%s died: no job runs on it any more (restart the server)", name, exc_info=exc)
        with self._cond:
            self._dead.add(name)
            self._faults[name] = f"died: {type(exc).__name__}: {exc}"
            held = [job for job, worker in self._running.items() if worker == name]
            queued = [] if self.alive else [job for q in self._queues.values() for job in q]
            if queued:
                self._queues.clear()
                self._waiting = 0
        for job in held:
            self._end(job, "error", DecodingFailed.of(exc))
        for job in queued:
            job.emit("error", DecodingFailed.of(exc))

    def _report(self, generation, done: bool, jobs: dict) -> None:
        """Send ``generation``'s news to its job: new text, and, once ``done``, how it ended.
        What fails here (rendering its text, say) ends that job alone with `DecodingFailed`,
        and its generation with it (its batch drops it at the next step)."""
        job = jobs.get(generation)
        if job is None:  # its report failed before: its job has ended
            return
        try:
            if generation.error is not None:
                ending = "error", DecodingFailed.of(generation.error)
            else:
                piece = generation.piece()  # once done: all that is left
                # a step that showed no text goes out with the next piece; the last ones, if
                # they showed none, with a piece of no text (its steps, for the final chunk)
                if piece.text or (done and piece.steps):
                    job.emit("delta", piece)
                if not done:
                    return
                _, output = generation.result()
                ending = "cancelled" if output.finish_reason == "cancelled" else "done", output
        except BaseException as exc:  # noqa: BLE001 - this job's failure, not the worker's
            if not generation.done:
                generation.fail(exc)
            ending = "error", DecodingFailed.of(exc)
        del jobs[generation]
        self._end(job, *ending)

    def _begin(self, decoder, rows, job: Job, batch, jobs: dict) -> None:
        """Start ``job``'s generation in ``batch`` (or report why not)."""
        if job.cancelled.is_set():
            return self._end(job, None)
        try:
            generation = job.start(decoder, rows, job)
        except BaseException as exc:  # noqa: BLE001 - the request's fault, reported to its client
            return self._end(job, "error", exc)
        job.emit("started")
        jobs[generation] = job
        batch.join(generation)

    def _end(self, job: Job, kind: str | None, payload=None) -> None:
        """``job`` has left its worker: tell its client how (``kind``: None, nobody is
        listening), and free its place."""
        if kind is not None:
            job.emit(kind, payload)
        elapsed = time.perf_counter() - job.started_at
        with self._cond:
            self._running.pop(job, None)
            self._active -= 1
            self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * elapsed

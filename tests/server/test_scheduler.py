"""The fair bounded queue, without models or HTTP."""

from __future__ import annotations

import asyncio
import threading
import weakref

import pytest

from anydraft.decoding import GenerationOutput
from anydraft.decoding.loop import Piece
from anydraft.server.scheduler import Job, QueueFull, Scheduler


class Finished:
    """A generation without a model: ``work()`` runs when the batch starts it, and then it is
    done (its output is ``work``'s return value as the text)."""

    row = error = None

    def __init__(self, work):
        self.work, self.done, self.text = work, False, ""

    def start(self, chunks=None) -> bool:
        self.text, self.done = self.work(), True
        return False

    def ready(self) -> bool:
        return False

    def fail(self, error) -> None:
        self.error, self.done = error, True

    def leave(self) -> None:
        pass

    def piece(self) -> Piece:
        return Piece()

    def result(self):
        return "", GenerationOutput(self.text, [], "length")


def job(work, loop, client="-") -> Job:
    """A job whose generation runs ``work(job)`` in the worker thread."""
    return Job(lambda decoder, rows, job: Finished(lambda: work(job)), loop, client=client)


async def outcome(job: Job) -> tuple:
    """The job's last event (after "started"): its kind and the output's text or the error."""
    while (event := await asyncio.wait_for(job.events.get(), 5))[0] == "started":
        pass
    kind, payload = event
    return kind, payload.text if kind == "done" else payload


def test_round_robin_across_clients_and_bounded_queue():
    async def main():
        loop = asyncio.get_running_loop()
        gate, order = threading.Event(), []

        def work(job):
            gate.wait(5)
            order.append(job.client)

        sched = Scheduler([object()], max_queue=5, max_per_client=5)
        sched.start()
        first = job(work, loop, client="a")
        sched.submit(first)
        while sched.active == 0:
            await asyncio.sleep(0.01)
        jobs = [job(work, loop, client=c) for c in ("a", "a", "a", "b", "c")]
        for j in jobs:
            sched.submit(j)
        with pytest.raises(QueueFull) as exc:
            sched.submit(job(work, loop, client="d"))
        assert exc.value.retry_after >= 1
        sched.cancel(jobs[1])  # a queued job that is cancelled leaves the queue at once
        assert sched.waiting == 4
        gate.set()
        for j in [first, jobs[0], *jobs[2:]]:
            assert await outcome(j) == ("done", None)
        sched.close()
        return order

    # a's second request waits behind b's and c's first
    assert asyncio.run(main()) == ["a", "a", "b", "c", "a"]


def test_a_failing_job_does_not_kill_the_worker():
    async def main():
        loop = asyncio.get_running_loop()
        sched = Scheduler([object()], max_queue=4, max_per_client=4)
        sched.start()

        def boom(decoder, rows, job):  # the request's generation cannot even start
            raise RuntimeError("boom")

        bad, good = Job(boom, loop), job(lambda job: "42", loop)
        sched.submit(bad)
        sched.submit(good)
        kind, exc = await outcome(bad)
        assert kind == "error" and isinstance(exc, RuntimeError)
        assert await outcome(good) == ("done", "42")
        sched.close()

    asyncio.run(main())


def test_each_client_may_hold_only_its_share_of_the_queue():
    async def main():
        loop = asyncio.get_running_loop()
        gate = threading.Event()

        def work(job):
            gate.wait(5)

        sched = Scheduler([object(), object()], max_queue=8, max_per_client=2)
        sched.start()
        running = [job(work, loop, client="a"), job(work, loop, client="a")]
        for j in running:  # free workers: not counted against the share
            sched.submit(j)
        while sched.active < 2:
            await asyncio.sleep(0.01)
        waiting = [job(work, loop, client="a"), job(work, loop, client="a")]
        for j in waiting:
            sched.submit(j)
        with pytest.raises(QueueFull) as exc:
            sched.submit(job(work, loop, client="a"))
        assert exc.value.per_client
        others = [job(work, loop, client="b"), job(work, loop, client="b")]
        for j in others:  # another client still has room
            sched.submit(j)
        sched.cancel(waiting[0])  # a's place frees up
        sched.submit(job(work, loop, client="a"))
        gate.set()
        for j in running + waiting[1:] + others:
            assert await outcome(j) == ("done", None)
        sched.close()

    asyncio.run(main())


class Stepping(Finished):
    """A generation that starts and then steps, on a row the step cannot take: the step's
    shared part fails, as a failed target call does."""

    def start(self, chunks=None) -> bool:
        self.row = object()
        return True

    def ready(self) -> bool:
        return True


def test_a_failed_step_still_reports_what_ended_before_it():
    """A job whose generation ended in the same `run_once` as a step that failed was never
    reported (nor its row counted free): the soak with batched rows found `active` at 44."""
    async def main():
        loop = asyncio.get_running_loop()
        rows = type("Decoder", (), {"new_rows": lambda self, n: None})()
        sched = Scheduler([rows], max_queue=4, max_per_client=4, max_batch=2)
        ends = job(lambda job: "ended", loop)
        fails = Job(lambda decoder, rows, job: Stepping(lambda: ""), loop)
        sched.submit(ends)
        sched.submit(fails)
        sched.start()  # both join one batch
        assert await outcome(ends) == ("done", "ended")
        kind, exc = await outcome(fails)
        assert kind == "error" and isinstance(exc.__cause__, AttributeError)
        while sched.active:
            await asyncio.sleep(0.01)
        sched.close()

    asyncio.run(main())


def test_the_completions_of_one_request_queue_all_or_none():
    """``n`` jobs of one request (`Scheduler.submit(*jobs)`): all queue, or none and
    `QueueFull`; a request asking for more than an idle server can ever hold is told how many
    it may (`most_at_once`)."""
    async def main():
        loop = asyncio.get_running_loop()
        gate = threading.Event()
        sched = Scheduler([object()], max_queue=4, max_per_client=3)
        assert sched.most_at_once == 3  # one row, a client's share of 3 of the 4 places
        sched.start()
        first = job(lambda j: gate.wait(5), loop, client="a")
        sched.submit(first)
        while sched.active == 0:
            await asyncio.sleep(0.01)
        three = [job(lambda j: "x", loop, client="b") for _ in range(3)]
        sched.submit(*three)
        assert sched.waiting == 3
        with pytest.raises(QueueFull):  # two more would pass the queue's 4
            sched.submit(*[job(lambda j: "y", loop, client="c") for _ in range(2)])
        assert sched.waiting == 3  # none of them queued
        gate.set()
        for j in three:
            assert await outcome(j) == ("done", "x")
        sched.close()

    asyncio.run(main())


# -- a worker survives what fails in it (issue 61) -------------------------------------------
class Rows:
    """A decoder whose `new_rows` fails on the calls numbered in ``fail`` (a llama.cpp batch
    context that cannot be allocated), and records whether the rows it made last were still
    referenced when it was called again."""

    def __init__(self, fail=()):
        self.fail, self.calls, self.made, self.pinned = set(fail), 0, None, []

    def new_rows(self, n):
        self.calls += 1
        self.pinned.append(self.made is not None and self.made() is not None)
        if self.calls in self.fail:
            raise MemoryError("llama_init_from_model: failed to allocate the KV cache")
        made = Made()
        self.made = weakref.ref(made)
        return made


class Made:
    """Rows as `Rows.new_rows` makes them (weakly referenceable: freed or not), on which a
    step's shared call fails."""

    @property
    def state(self):
        raise RuntimeError("llama.cpp decode failed (status 1)")


class OnRows(Stepping):
    """A generation whose row is the batch's rows themselves: the step that fails on it holds
    them in its frames, as a failed llama.cpp call holds its batch."""

    def __init__(self, rows):
        super().__init__(lambda: "")
        self.rows = rows

    def start(self, chunks=None) -> bool:
        self.row = self.rows
        return True


def test_rows_that_cannot_be_made_fail_the_jobs_taken_and_are_made_for_the_next_job():
    """A failed step made new rows outside any `try`: a failure there (a llama.cpp context
    that cannot be allocated beside the failed one, still pinned by the traceback) killed the
    worker, and every later request hung."""
    async def main():
        loop = asyncio.get_running_loop()
        decoder = Rows(fail={2, 3})  # after the failed step, and for the next job
        sched = Scheduler([decoder], max_queue=4, max_per_client=4, max_batch=2)
        sched.start()
        failing = Job(lambda decoder, rows, job: OnRows(rows), loop)
        sched.submit(failing)
        kind, exc = await outcome(failing)
        assert kind == "error" and isinstance(exc.__cause__, RuntimeError)
        while "anydraft-worker-0" not in sched.faults:  # the worker makes rows after failing it
            await asyncio.sleep(0.01)
        assert decoder.pinned == [False, False]  # the failed batch's rows went first
        assert "cannot make its batch's rows: MemoryError" in sched.faults["anydraft-worker-0"]
        unlucky, lucky = job(lambda job: "no", loop), job(lambda job: "yes", loop)
        sched.submit(unlucky)
        kind, exc = await outcome(unlucky)
        assert kind == "error" and isinstance(exc.__cause__, MemoryError)
        await asyncio.sleep(0.2)
        assert decoder.calls == 3  # no job, no try: it waits rather than spins
        sched.submit(lucky)
        assert await outcome(lucky) == ("done", "yes")
        assert decoder.calls == 4 and sched.faults == {}
        sched.close()

    asyncio.run(main())


class Unreadable(Finished):
    """A generation whose text cannot be rendered (a bug in a detokenizer, say)."""

    def piece(self) -> Piece:
        raise UnicodeError("cannot render")


def test_a_report_that_fails_ends_its_job_alone():
    """`_report` ran outside any `try`: its failure killed the worker and hung every job."""
    async def main():
        loop = asyncio.get_running_loop()
        sched = Scheduler([Rows()], max_queue=4, max_per_client=4, max_batch=2)
        bad = Job(lambda decoder, rows, job: Unreadable(lambda: ""), loop)
        beside, after = job(lambda job: "beside", loop), job(lambda job: "after", loop)
        sched.submit(bad, beside)
        sched.start()  # both join one batch
        kind, exc = await outcome(bad)
        assert kind == "error" and isinstance(exc.__cause__, UnicodeError)
        assert await outcome(beside) == ("done", "beside")
        sched.submit(after)
        assert await outcome(after) == ("done", "after")
        sched.close()

    asyncio.run(main())


def test_a_worker_that_dies_is_recorded_and_no_job_waits_for_it(monkeypatch):
    """Whatever still kills a worker (a bug in the scheduler itself) is recorded for /health,
    and with no worker left the queued jobs fail and new ones are refused."""
    from anydraft.server.scheduler import DecodingFailed, NoWorkers

    def broken(self):
        raise RuntimeError("a bug")

    monkeypatch.setattr(Scheduler, "_next_job", broken)

    async def main():
        loop = asyncio.get_running_loop()
        sched = Scheduler([object()], max_queue=4, max_per_client=4)
        queued = job(lambda job: "never", loop)
        sched.submit(queued)
        sched.start()
        kind, exc = await outcome(queued)
        assert kind == "error" and isinstance(exc, DecodingFailed), exc
        assert sched.faults == {"anydraft-worker-0": "died: RuntimeError: a bug"}
        assert sched.alive == 0 and sched.waiting == 0
        with pytest.raises(NoWorkers):
            sched.submit(job(lambda job: "never", loop))
        sched.close()

    asyncio.run(main())

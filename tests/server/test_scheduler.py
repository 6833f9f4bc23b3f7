"""The fair bounded queue, without models or HTTP."""

from __future__ import annotations

import asyncio
import threading

import pytest

from anydraft.server.scheduler import Job, QueueFull, Scheduler


def test_round_robin_across_clients_and_bounded_queue():
    async def main():
        loop = asyncio.get_running_loop()
        gate, order = threading.Event(), []

        def work(decoder, job):
            gate.wait(5)
            order.append(job.client)
            job.emit("done")

        sched = Scheduler([object()], max_queue=5, max_per_client=5)
        sched.start()
        first = Job(work, loop, client="a")
        sched.submit(first)
        while sched.active == 0:
            await asyncio.sleep(0.01)
        jobs = [Job(work, loop, client=c) for c in ("a", "a", "a", "b", "c")]
        for job in jobs:
            sched.submit(job)
        with pytest.raises(QueueFull) as exc:
            sched.submit(Job(work, loop, client="d"))
        assert exc.value.retry_after >= 1
        sched.cancel(jobs[1])  # a queued job that is cancelled leaves the queue at once
        assert sched.waiting == 4
        gate.set()
        for job in [first, jobs[0], *jobs[2:]]:
            assert await asyncio.wait_for(job.events.get(), 5) == ("done", None)
        sched.close()
        return order

    # a's second request waits behind b's and c's first
    assert asyncio.run(main()) == ["a", "a", "b", "c", "a"]


def test_a_failing_job_does_not_kill_the_worker():
    async def main():
        loop = asyncio.get_running_loop()
        sched = Scheduler([object()], max_queue=4, max_per_client=4)
        sched.start()

        def boom(decoder, job):
            raise RuntimeError("boom")

        def ok(decoder, job):
            job.emit("done", 42)

        bad, good = Job(boom, loop), Job(ok, loop)
        sched.submit(bad)
        sched.submit(good)
        kind, exc = await asyncio.wait_for(bad.events.get(), 5)
        assert kind == "error" and isinstance(exc, RuntimeError)
        assert await asyncio.wait_for(good.events.get(), 5) == ("done", 42)
        sched.close()

    asyncio.run(main())


def test_each_client_may_hold_only_its_share_of_the_queue():
    async def main():
        loop = asyncio.get_running_loop()
        gate = threading.Event()

        def work(decoder, job):
            gate.wait(5)
            job.emit("done")

        sched = Scheduler([object(), object()], max_queue=8, max_per_client=2)
        sched.start()
        running = [Job(work, loop, client="a"), Job(work, loop, client="a")]
        for job in running:  # free workers: not counted against the share
            sched.submit(job)
        while sched.active < 2:
            await asyncio.sleep(0.01)
        waiting = [Job(work, loop, client="a"), Job(work, loop, client="a")]
        for job in waiting:
            sched.submit(job)
        with pytest.raises(QueueFull) as exc:
            sched.submit(Job(work, loop, client="a"))
        assert exc.value.per_client
        others = [Job(work, loop, client="b"), Job(work, loop, client="b")]
        for job in others:  # another client still has room
            sched.submit(job)
        sched.cancel(waiting[0])  # a's place frees up
        sched.submit(Job(work, loop, client="a"))
        gate.set()
        for job in running + waiting[1:] + others:
            assert await asyncio.wait_for(job.events.get(), 5) == ("done", None)
        sched.close()

    asyncio.run(main())

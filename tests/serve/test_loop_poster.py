"""serve.service.LoopPoster: engine-thread items reach the event loop's queues in order, none lost, with one
loop wake-up for everything posted before the loop delivers."""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from prodip.serve.service import LoopPoster


def test_posts_before_a_delivery_share_one_wakeup():
    loop = asyncio.new_event_loop()
    try:
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda cb, *a: wakeups.append(cb) or real(cb, *a)
        poster = LoopPoster(loop)
        q1, q2 = asyncio.Queue(), asyncio.Queue()

        def step():  # one engine step of two streams, five tokens each
            for i in range(5):
                poster.post(q1, i)
                poster.post(q2, -i)

        engine = threading.Thread(target=step)
        engine.start()
        engine.join()
        assert len(wakeups) == 1
        loop.run_until_complete(asyncio.sleep(0))
        assert [q1.get_nowait() for _ in range(5)] == [0, 1, 2, 3, 4]
        assert [q2.get_nowait() for _ in range(5)] == [0, -1, -2, -3, -4]
        poster.post(q1, 99)  # after the delivery: a wake-up of its own
        assert len(wakeups) == 2
        loop.run_until_complete(asyncio.sleep(0))
        assert q1.get_nowait() == 99
    finally:
        loop.close()


def test_items_posted_while_the_loop_delivers_are_not_lost():
    """An engine thread posting as fast as it can while the loop drains: every item arrives, in order."""

    async def main() -> list[int]:
        poster = LoopPoster(asyncio.get_running_loop())
        queue: asyncio.Queue = asyncio.Queue()
        n = 20000

        def engine():
            for i in range(n):
                poster.post(queue, i)

        thread = threading.Thread(target=engine)
        thread.start()
        got = [await asyncio.wait_for(queue.get(), 10) for _ in range(n)]
        thread.join()
        return got

    assert asyncio.run(main()) == list(range(20000))


def test_an_item_posted_as_a_delivery_ends_gets_a_wakeup():
    """The engine posts just after the loop found the outbox empty and before the delivery returns:
    the item gets a delivery of its own (it would be stranded if the pending flag were cleared after
    draining instead of before)."""

    async def main() -> list[str]:
        poster = LoopPoster(asyncio.get_running_loop())
        queue: asyncio.Queue = asyncio.Queue()

        class Outbox(deque):
            fired = False

            def __bool__(self) -> bool:
                empty = len(self) == 0
                if empty and not self.fired:  # the drain's last check: the engine posts right now
                    self.fired = True
                    engine = threading.Thread(target=poster.post, args=(queue, "late"))
                    engine.start()
                    engine.join()
                return not empty

        poster._outbox = Outbox()
        poster.post(queue, "first")
        return [await asyncio.wait_for(queue.get(), 5) for _ in range(2)]

    assert asyncio.run(main()) == ["first", "late"]

"""serve.service.LoopPoster: engine-thread items reach the event loop's queues in order, none lost, with one
loop wake-up for everything posted before the loop delivers."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque

import pytest

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


def test_the_engine_thread_never_wakes_the_loop_itself(tiny_export, monkeypatch):
    """Served streams reach the client through the waker thread: the engine thread only appends to the
    outbox and sets an event; the write to the loop's self-pipe (which hands the GIL to the woken loop)
    is the waker's. Every token arrives, and the waker ends with the server."""
    from fastapi.testclient import TestClient

    from prodip.serve.app import create_app
    from tests.serve.conftest import LOCAL, wait_ready

    callers = []
    real = asyncio.BaseEventLoop.call_soon_threadsafe

    def spy(self, callback, *args, **kwargs):
        callers.append(threading.current_thread().name)
        return real(self, callback, *args, **kwargs)

    monkeypatch.setattr(asyncio.BaseEventLoop, "call_soon_threadsafe", spy)
    with TestClient(create_app(tiny_export[0], "fp32", batch_wait_ms=2.0), base_url=LOCAL) as client:
        wait_ready(client)
        body = {"prompt": [1, 40, 41], "max_new_tokens": 12, "temperature": 0, "stream": True, "ignore_eos": True}
        with client.stream("POST", "/v1/generate", json=body) as resp:
            events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert sum(e["token_id"] is not None for e in events) == 12 and events[-1]["finish_reason"] == "length"
    assert "prodip-loop-waker" in callers and "prodip-engine" not in callers
    assert not any(t.name == "prodip-loop-waker" and t.is_alive() for t in threading.enumerate())


def _stream_counting_wakes(tiny_export, monkeypatch, interval_ms, max_new_tokens):
    """One streamed greedy /v1/generate at ``stream_interval_ms=interval_ms``: (its events, how often the engine
    thread asked the waker to wake the loop during it, how often the loop polled during it, the same request
    unstreamed)."""
    from fastapi.testclient import TestClient

    from prodip.serve.app import create_app
    from tests.serve.conftest import LOCAL, wait_ready

    polls = []
    real_poll = LoopPoster._poll
    monkeypatch.setattr(LoopPoster, "_poll", lambda self: polls.append(1) or real_poll(self))
    app = create_app(tiny_export[0], "fp32", batch_wait_ms=2.0, stream_interval_ms=interval_ms)
    with TestClient(app, base_url=LOCAL) as client:
        wait_ready(client)
        svc = app.state.service
        asks = []
        real_set = svc._wake.set
        svc._wake.set = lambda: asks.append(threading.current_thread().name) or real_set()
        body = {"prompt": [1, 40, 41], "max_new_tokens": max_new_tokens, "temperature": 0, "stream": True}
        body["ignore_eos"] = True
        with client.stream("POST", "/v1/generate", json=body) as resp:
            events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
        streamed_asks, streamed_polls = asks.count("prodip-engine"), len(polls)
        whole = client.post("/v1/generate", json={**body, "stream": False}).json()
    return events, streamed_asks, streamed_polls, whole


@pytest.mark.parametrize("interval_ms", [0.0, 60_000.0])
def test_tokens_between_the_first_and_the_end_wait_for_the_stream_interval(tiny_export, monkeypatch, interval_ms):
    """--stream-interval-ms: the engine has a stream's first token and its end handed to the loop at its next
    step, the tokens between them at most that often. With a minute, a 12-token stream asks the waker twice
    (its first token; the rest with its end); at 0, after every engine step. Every token arrives, in order."""
    events, streamed_asks, _, whole = _stream_counting_wakes(tiny_export, monkeypatch, interval_ms, 12)
    tokens = [e["token_id"] for e in events if e["token_id"] is not None]
    assert len(tokens) == 12 and events[-1]["finish_reason"] == "length"
    assert tokens == whole["token_ids"]
    assert streamed_asks == (2 if interval_ms else 12)  # at 0: the prefill's step and 11 decode steps


def test_a_watched_loop_takes_later_items_itself_until_the_last_stream_ends():
    """LoopPoster.watch: while a stream runs, the loop takes what was posted with post_later every interval,
    woken by its own timer (no call_soon_threadsafe); the polling stops after the last unwatch."""
    loop = asyncio.new_event_loop()
    try:
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda cb, *a: wakeups.append(cb) or real(cb, *a)
        poster = LoopPoster(loop, interval_s=0.01)
        q = asyncio.Queue()

        async def stream():
            poster.watch()
            got = []
            try:
                feeder = threading.Thread(target=lambda: [poster.post_later(q, i) for i in range(3)])
                feeder.start()
                feeder.join()
                while len(got) < 3:
                    got.append(await asyncio.wait_for(q.get(), 5))
            finally:
                poster.unwatch()
            return got

        assert loop.run_until_complete(stream()) == [0, 1, 2]
        assert wakeups == []
        assert poster._poll_handle is not None  # the poll's last turn is due, then it stops
        loop.run_until_complete(asyncio.sleep(0.05))
        assert poster._poll_handle is None
        poster.post_later(q, 3)
        loop.run_until_complete(asyncio.sleep(0.05))
        assert q.empty()  # nobody watches: only a flush delivers now
        poster.flush()
        loop.run_until_complete(asyncio.sleep(0))
        assert q.get_nowait() == 3
    finally:
        loop.close()


def test_tokens_between_the_first_and_the_end_come_with_the_loops_poll(tiny_export, monkeypatch):
    """At a stream interval shorter than the stream, the engine has the loop woken for the first token and the
    end only; the tokens between arrive with the loop's own polls. Every token arrives, in order."""
    events, streamed_asks, streamed_polls, whole = _stream_counting_wakes(tiny_export, monkeypatch, 1.0, 80)
    tokens = [e["token_id"] for e in events if e["token_id"] is not None]
    assert tokens == whole["token_ids"] and len(tokens) == 80
    assert streamed_asks == 2  # the first token, the end
    assert streamed_polls >= 2


def test_tokens_before_an_engine_error_arrive_before_it(tiny_export, monkeypatch):
    """A sequence that fails in the engine while its tokens wait for the stream interval: the tokens it had
    are emitted before its end, arrive in one hand-over with it, and are streamed before the error event."""
    from fastapi.testclient import TestClient

    from prodip.serve.app import create_app
    from prodip.serve.engine import OnnxDecoder
    from tests.serve.conftest import LOCAL, wait_ready

    real_decode, calls = OnnxDecoder.decode, []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("boom")
        return real_decode(self, *args, **kwargs)

    monkeypatch.setattr(OnnxDecoder, "decode", failing)
    app = create_app(tiny_export[0], "fp32", batch_wait_ms=2.0, stream_interval_ms=60_000.0)
    with TestClient(app, base_url=LOCAL) as client:
        wait_ready(client)
        body = {"prompt": [1, 40, 41], "max_new_tokens": 20, "temperature": 0, "stream": True, "ignore_eos": True}
        with client.stream("POST", "/v1/generate", json=body) as resp:
            events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
        metrics = client.get("/metrics").text
    assert [e.get("token_id") is not None for e in events] == [True] * 5 + [False]  # prefill's token + 4 steps
    assert "RuntimeError: boom" in events[-1]["error"]["message"]
    assert "prodip_generated_tokens_total 5.0" in metrics

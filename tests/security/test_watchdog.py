"""Finding 6: a stuck engine shows in /health, and whatever raises in the engine loop, every
request in flight gets an answer. Real HTTP, the real model; the stuck step is a real one
blocked inside the executor, the faults are exceptions raised at the engine's own calls."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.server.conftest import MODEL, GatedExecutor, serve, wait_for, wrapped_engine

BODY = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}


def _health(served) -> int:
    return httpx.get(served.base_url + "/health", timeout=10).status_code


def test_a_stuck_step_turns_health_503_until_it_finishes(llm):
    engine = wrapped_engine(llm, GatedExecutor)
    gate = engine.executor
    with serve(engine, "--engine-iteration-timeout", "0.5") as served:
        assert _health(served) == 200
        gate.close()
        result: dict[str, httpx.Response] = {}
        client = threading.Thread(target=lambda: result.update(
            r=httpx.post(served.v1 + "/completions", json=BODY, timeout=120)))
        client.start()
        try:
            assert gate.blocked.wait(60), "the step never reached the executor"
            wait_for(lambda: _health(served) == 503, 30, "/health to report the stuck step")
            r = httpx.get(served.base_url + "/health", timeout=10)
            assert "stalled" in r.json()["error"]["message"] and "--engine-iteration-timeout" in r.json()["error"]["message"]
        finally:
            gate.open()
            client.join(120)
        assert result["r"].status_code == 200
        wait_for(lambda: _health(served) == 200, 30, "/health back once steps finish")


def test_an_idle_engine_is_never_stalled(llm):
    """No work pending: however long since the last step, the watchdog stays quiet."""
    engine = wrapped_engine(llm, GatedExecutor)
    with serve(engine, "--engine-iteration-timeout", "0.5") as served:
        assert httpx.post(served.v1 + "/completions", json=BODY, timeout=120).status_code == 200
        loop = served.service.loop
        loop._progress_at -= 3600          # the last step an hour ago, nothing pending
        assert loop.stalled_for() == 0.0 and _health(served) == 200


def test_a_failing_snapshot_does_not_stop_the_loop(llm):
    """`snapshot()` used to run outside the loop's guard: one raise ended the thread and every
    request in flight waited forever. Now the step's outputs still go out."""
    engine = wrapped_engine(llm, lambda inner: inner)

    def broken_snapshot():
        raise RuntimeError("snapshot failed")

    with serve(engine) as served:
        engine.snapshot = broken_snapshot
        try:
            r = httpx.post(served.v1 + "/completions", json=BODY, timeout=60)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
            assert served.service.loop.alive and _health(served) == 200
        finally:
            del engine.snapshot


def test_a_failing_has_unfinished_requests_answers_everyone(llm):
    """`has_unfinished_requests()` raising (three times: the loop gives up) fails the request in
    flight with a 500 naming an error id, never the exception's text, and /health turns 503."""
    engine = wrapped_engine(llm, lambda inner: inner)
    real = engine.has_unfinished_requests
    armed = threading.Event()

    def flaky():
        if armed.is_set() and threading.current_thread().name == "pacer-engine":
            raise RuntimeError("secret internal detail")
        return real()

    with serve(engine) as served:
        engine.has_unfinished_requests = flaky
        try:
            armed.set()
            r = httpx.post(served.v1 + "/completions", json=BODY, timeout=60)
            assert r.status_code == 500
            err = r.json()["error"]
            assert err["type"] == "server_error" and "error id" in err["message"]
            assert "secret" not in r.text
            wait_for(lambda: not served.service.loop.alive, 30, "the loop to give up")
            assert _health(served) == 503
            late = httpx.post(served.v1 + "/completions", json=BODY, timeout=60)
            assert late.status_code == 503 and "secret" not in late.text
        finally:
            armed.clear()
            del engine.has_unfinished_requests


def test_a_request_added_while_the_loop_gives_up_is_answered(llm):
    """The loop gives up after three failed steps in a row. It used to fail the requests in
    flight first and set its error after: a request added in between was queued to a dead
    loop and never answered. The error is now set under the lock `add` takes."""
    engine = wrapped_engine(llm, lambda inner: inner)
    real_step, real_abort = engine.step, engine.abort_request
    failing = threading.Event()
    giving_up, late_decided = threading.Event(), threading.Event()
    engine_aborts = []

    def step():
        if failing.is_set():
            raise RuntimeError("step failed")
        return real_step()

    def abort_request(request_id):
        if threading.current_thread().name == "pacer-engine":
            engine_aborts.append(request_id)
            if len(engine_aborts) == 3:   # the third failure: the loop is giving up
                giving_up.set()
                late_decided.wait(60)
        return real_abort(request_id)

    with serve(engine) as served:
        engine.step, engine.abort_request = step, abort_request
        try:
            failing.set()
            first: dict[str, httpx.Response] = {}
            t = threading.Thread(target=lambda: first.update(
                r=httpx.post(served.v1 + "/completions", json=BODY, timeout=60)))
            t.start()
            assert giving_up.wait(60), "the loop never gave up"
            late: dict[str, httpx.Response | Exception] = {}

            def send_late():
                try:
                    late["r"] = httpx.post(served.v1 + "/completions", json=BODY, timeout=30)
                except httpx.HTTPError as e:
                    late["r"] = e

            sender = threading.Thread(target=send_late)
            sender.start()
            # the late request is decided once the loop has it, or once it was answered
            wait_for(lambda: served.service.loop.num_routes > 1 or "r" in late, 30, "the late request to arrive")
            late_decided.set()
            sender.join(60)
            t.join(60)
        finally:
            late_decided.set()
            failing.clear()
            del engine.step, engine.abort_request
    assert first["r"].status_code == 500
    answer = late["r"]
    assert isinstance(answer, httpx.Response), f"the late request was never answered: {answer!r}"
    assert answer.status_code in (500, 503)


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_the_watchdog_flag_is_checked(value):
    import argparse

    from pacer.cli.serve import add_args

    parser = argparse.ArgumentParser()
    add_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--engine-iteration-timeout", value])
    assert parser.parse_args(["--engine-iteration-timeout", "none"]).engine_iteration_timeout is None

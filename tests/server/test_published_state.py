"""/metrics and /debug/state read the snapshot the engine loop publishes after each step: a scrape
on the event loop never calls into the engine, which its own thread is mutating."""

from __future__ import annotations

import threading

import httpx

from tests.server.conftest import serve


def test_scrapes_never_touch_the_engine_off_its_thread(llm):
    engine = llm.engine
    real_snapshot = engine.snapshot
    foreign: list[str] = []

    def snapshot_on_the_engine_thread_only():
        if threading.current_thread().name != "pacer-engine":
            foreign.append(threading.current_thread().name)
        return real_snapshot()

    with serve(engine) as s:
        engine.snapshot = snapshot_on_the_engine_thread_only   # instance attribute: this engine only
        try:
            with httpx.Client(base_url=s.base_url, timeout=60) as client:
                r = client.post("/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": "Hello",
                                                         "max_tokens": 4, "temperature": 0})
                assert r.status_code == 200, r.text
                metrics = client.get("/metrics")
                state = client.get("/debug/state")
        finally:
            del engine.snapshot
    assert metrics.status_code == 200 and "kv_tier_blocks" in metrics.text and "structured_outputs_" in metrics.text
    assert state.status_code == 200 and state.json()["engine"]["num_running"] == 0
    assert foreign == [], f"snapshot() called from {sorted(set(foreign))}"

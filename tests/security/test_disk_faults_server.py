"""Finding 3 through a real server: with the disk KV tier on and every block write failing
(ENOSPC injected at the rename, as a full disk gives it), `pacer serve` keeps answering, every
request completes with the outputs of a healthy tier, `/health` stays 200 and the fault is
counted in the disk tier's stats."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import make
from tests.server.conftest import MODEL, serve

SHOPS = ["Anna", "Ben", "Cleo", "Dora"]
KW = dict(num_kv_blocks=8, block_size=8, kv_offloading_size=1.0, num_cpu_blocks=64)


def _ask(served, name: str) -> str:
    client = openai.OpenAI(base_url=served.v1, api_key="x", max_retries=0, timeout=120)
    r = client.completions.create(model=MODEL, max_tokens=4, temperature=0,
                                  prompt=f"Shop of {name}: you answer questions about opening hours. Be brief. "
                                         f"When does the shop of {name} open on Sunday?")
    return r.choices[0].text


def test_a_full_disk_leaves_the_server_serving(base, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    healthy = make(base, **KW, kv_offloading_dir=str(tmp_path / "ok"))
    with serve(healthy) as served:
        want = [_ask(served, n) for n in SHOPS]
    real_replace = os.replace
    disk_dir = str(tmp_path / "full")

    def full_disk(src, dst, *a, **kw):
        if str(dst).startswith(disk_dir):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", full_disk)
    engine = make(base, **KW, kv_offloading_dir=disk_dir)
    with serve(engine) as served:
        got = [_ask(served, n) for n in SHOPS]            # each evicts (demotes, writes) the one before
        health = httpx.get(served.base_url + "/health")
        disk = served.service.loop.state.tiers["disk"]
    assert got == want
    assert health.status_code == 200
    assert disk["io_errors"] >= 1 and not list(Path(disk_dir).glob("*.kvblock"))

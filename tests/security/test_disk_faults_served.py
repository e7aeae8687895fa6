"""Issue 27, finding 3 on a real server: with the disk KV tier on, a block write that fails
(an OSError injected at the file system call that lands each block file, as a full disk
would raise it) leaves every request answered, `/health` 200, and the fault counted in
`/metrics` (`kv_tier_io_errors{tier="disk"}`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import httpx
import openai
import pytest

from pacer.engine import Engine
from pacer.kv.tiers.disk import DiskTier
from tests.conftest import make
from tests.server.conftest import MODEL, serve

TOPICS = ["tides", "volcanoes", "glaciers", "deserts", "comets", "coral reefs"]


def test_a_full_disk_leaves_the_server_serving(base: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "kv"
    engine = make(base, num_kv_blocks=8, block_size=8, kv_offloading_size=1.0, num_cpu_blocks=16,
                  kv_offloading_dir=str(directory))
    (disk,) = engine.tiers
    assert isinstance(disk, DiskTier)
    real_replace = os.replace

    def full_disk(src: str, dst: str, *a: object, **kw: object) -> None:
        if str(dst).startswith(str(directory)):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        real_replace(src, dst, *a, **kw)   # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", full_disk)
    try:
        with serve(engine) as served:
            client = openai.OpenAI(base_url=served.v1, api_key="unused", max_retries=0)
            for topic in TOPICS:   # each prompt evicts the one before: blocks go host -> disk
                out = client.completions.create(model=MODEL, max_tokens=8, temperature=0.0,
                                                prompt=f"Write one plain sentence for children about {topic} "
                                                       f"and why {topic} matter to the people who live nearby.")
                assert out.choices[0].finish_reason in ("length", "stop")   # answered, not an error
            assert httpx.get(served.base_url + "/health").status_code == 200
            metrics = httpx.get(served.base_url + "/metrics").text
    finally:
        monkeypatch.undo()
        engine.shutdown()
    assert disk.index.stats.io_errors >= 1 and disk.index.stats.written == 0
    line = next(row for row in metrics.splitlines()
                if "kv_tier_io_errors" in row and 'tier="disk"' in row and not row.startswith("#"))
    assert float(line.rsplit(" ", 1)[1]) == disk.index.stats.io_errors
    assert not [n for n in os.listdir(directory) if n.endswith(".tmp")]   # no temp file left behind

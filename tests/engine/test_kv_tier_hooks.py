"""The KV tier hooks on the fake executor: `Engine.step()` calls `before_step` with the step's
plan (after scheduling, before its copies run) and `after_step` once its copies ran and the
update applied; `shutdown` flushes and `snapshot` carries each tier's row. The disk tier behind
them writes a demoted block only after the step that copied it to the host, and a restarted
engine reads the files back into its host tier and hits them with the KV the fake executor
checks position by position."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pacer.clock import VirtualClock
from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.engine.tier_hooks import KVTierFactory
from pacer.kv.manager import KVCacheManager
from pacer.kv.tiers.disk import DiskTier
from pacer.request import SamplingParams
from pacer.sched.contract import SchedulerOutput
from tests.fakes import EOS, FakeExecutor, reference_output, run

BS = 4
GREEDY = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)


def _engine(ex: FakeExecutor, tiers: list[KVTierFactory], num_blocks: int, **kw: Any) -> Engine:
    """An engine over `ex` whose KV tier hooks `tiers` open (the factories see `ex` themselves)."""
    cfg = EngineConfig.from_kwargs(num_kv_blocks=num_blocks, block_size=BS, max_model_len=32, **kw)
    eng = Engine(cfg, ex, tokenizer=None, num_kv_blocks=num_blocks, model_max_len=32, eos_token_ids=(EOS,),
                 clock=VirtualClock(), vocab_size=1000, tiers=tiers)
    ex.scheduler = eng.scheduler
    return eng


class RecordingTier:
    """A tier hook that records when it is called and what the engine looks like then."""

    name = "recorder"

    def __init__(self, kv: KVCacheManager, ex: FakeExecutor, log: list[tuple[Any, ...]]) -> None:
        self.kv, self.ex, self.log = kv, ex, log
        log.append(("open", kv.num_blocks))

    def before_step(self, out: SchedulerOutput) -> None:
        assert self.ex.scheduler is not None
        self._planned = [self.ex.scheduler.requests[sr.request_id] for sr in out.scheduled]
        self.log.append(("before", out.step_id, len(self.ex.steps)))   # the executor has not run it yet

    def after_step(self) -> None:
        done = sum(r.num_output_tokens for r in self._planned)          # its requests, updated
        self.log.append(("after", self.ex.steps[-1].step_id, len(self.ex.steps), done))

    def flush(self) -> int:
        self.log.append(("flush",))
        return 0

    def stats(self) -> dict[str, float]:
        return {"blocks": 3.0}


def test_the_engine_calls_its_tier_hooks_in_step_order() -> None:
    log: list[tuple[Any, ...]] = []
    ex = FakeExecutor(BS)
    eng = _engine(ex, [lambda kv: RecordingTier(kv, ex, log)], num_blocks=16)
    assert log == [("open", 16)] and isinstance(eng.tiers[0], RecordingTier) and eng.tiers[0].kv is eng.kv
    rid = eng.add_request([1, 2, 3, 4, 5], GREEDY)
    finals = run(eng, ex)
    assert finals[rid].token_ids == reference_output([1, 2, 3, 4, 5], GREEDY)
    calls = log[1:]
    assert [c[0] for c in calls] == ["before", "after"] * (len(calls) // 2)
    for n, (before, after) in enumerate(zip(calls[::2], calls[1::2])):
        assert before[2] == n and after[1:3] == (before[1], n + 1)     # before: planned, not run; after: run
    assert [c[3] for c in calls[1::2]] == [1, 2, 3]                    # after the update: its token appended
    assert eng.snapshot().tiers["recorder"] == {"blocks": 3.0} and eng.snapshot().tiers["recorder"]
    eng.shutdown()
    assert log[-1] == ("flush",)


class FakeBlockStore:
    """The fake executor's KV (slot -> (token, position)) as bytes, in and out of its host tier."""

    identity = {"model": "fake", "block_size": BS}

    def __init__(self, ex: FakeExecutor) -> None:
        self.ex = ex

    def device_block(self, block_id: int) -> bytes:
        return json.dumps([self.ex.slots.get(block_id * BS + i) for i in range(BS)]).encode()

    def host_block(self, slot: int) -> bytes | None:
        content = self.ex.cpu.get(slot)
        return None if content is None else json.dumps(content).encode()

    def put_host_block(self, slot: int, data: bytes) -> None:
        self.ex.cpu[slot] = [None if c is None else (c[0], c[1]) for c in json.loads(data)]


class WatchedDisk:
    """The disk tier, noting which keys it wrote in which hook call."""

    name = "disk"

    def __init__(self, disk: DiskTier, writes: list[tuple[str, int, set[int]]]) -> None:
        self.disk, self.writes, self._step = disk, writes, -1
        self._plans: dict[int, set[int]] = {}

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        before = set(self.disk.index.keys)
        result = fn(*args)
        self.writes.append((what, self._step, set(self.disk.index.keys) - before))
        return result

    def before_step(self, out: SchedulerOutput) -> None:
        self._step = out.step_id
        self._plans[out.step_id] = {slot for _, slot in out.swap_out}
        self._call("before", self.disk.before_step, out)

    def after_step(self) -> None:
        self._call("after", self.disk.after_step)

    def flush(self) -> int:
        return int(self._call("flush", self.disk.flush))

    def stats(self) -> dict[str, float]:
        return self.disk.stats()


def _disk_engine(directory: Path, writes: list[tuple[str, int, set[int]]]) -> tuple[Engine, FakeExecutor, Any]:
    """8 device blocks, a host tier of 32 and the disk tier over `directory` (watched)."""
    ex = FakeExecutor(BS)
    store = FakeBlockStore(ex)
    eng = _engine(ex, [lambda kv: WatchedDisk(DiskTier.open(kv, str(directory), store), writes)], num_blocks=8,
                  kv_offloading_size=1.0, num_cpu_blocks=32, kv_offloading_dir=str(directory))
    return eng, ex, eng.tiers[0]


def test_the_disk_tier_writes_a_demoted_block_after_the_step_that_copied_it(tmp_path: Path) -> None:
    writes: list[tuple[str, int, set[int]]] = []
    eng, ex, watched = _disk_engine(tmp_path, writes)
    prompts = [[100 * i + j for j in range(1, 18)] for i in range(4)]   # 4 full blocks each, on 8 blocks
    for p in prompts:                                                   # each evicts (demotes) the one before
        rid = eng.add_request(p, GREEDY)
        assert run(eng, ex)[rid].token_ids == reference_output(p, GREEDY)
    host = eng.kv.host_tier
    assert host is not None and host.stats.demotions > 0
    written = {key for what, _, keys in writes if what == "after" for key in keys}
    assert written and not any(keys for what, _, keys in writes if what == "before")
    for what, step, keys in writes:
        for key in keys:                                                # its host copy ran in that very step
            entry = host.entry(key)
            assert entry is not None and entry[0] in watched._plans[step], (what, step, key)
    eng.shutdown()                                                      # the device tree's blocks too
    flushed = writes[-1][2]
    assert writes[-1][0] == "flush" and flushed and not flushed & written
    files = sorted(tmp_path.glob("*.kvblock"))
    assert len(files) == len(written | flushed)

    again: list[tuple[str, int, set[int]]] = []
    second, ex2, disk2 = _disk_engine(tmp_path, again)
    assert disk2.disk.index.stats.loaded == len(files) and second.kv.host_tier.num_offloaded_blocks == len(files)
    rid = second.add_request(prompts[-1], GREEDY)                       # the first request after a restart
    out = run(second, ex2)[rid]                                         # (the fake checks every cached position)
    assert out.token_ids == reference_output(prompts[-1], GREEDY)
    assert out.num_cached_tokens == 16 and out.metrics.cached_tokens_host == 16   # all promoted from the host
    tiers = second.snapshot().tiers
    assert tiers["disk"]["promotions"] == len(files) and tiers["host"]["promotions"] == 4
    second.kv.check_invariants()

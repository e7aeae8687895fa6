"""The prefix-cache timing channel between two tenants, isolated vs shared, side by side.

  python benchmarks/isolation_timing.py [--trials 30] [--prompt-len 320] [--threads 1]

For each `--tenant-isolation` mode, serves the real model over HTTP with two API keys bound
to tenants `victim` and `attacker`, and runs `pacer.bench.timing_channel.run_trials`: the
victim sends a fresh prompt, the attacker times that prompt and a fresh one of the same
length (random order, max_tokens=1). Prints per mode the mean latencies, the paired log
ratio's TOST against the margin log(1.25) and the cached tokens the attacker was told,
with the load average. Never asserts: the test is tests/server/test_isolation_timing.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from pacer.bench.timing_channel import log_ratios, run_trials
from pacer.cli.serve import add_args as add_serve_args
from pacer.llm import LLM
from pacer.server.cli import DEFAULT_MODEL_NAME, build_service
from pacer.workload.equivalence import tost_paired

KEYS = {"keys": [{"name": "victim", "key": "victim-key", "tenant": "victim"},
                 {"name": "attacker", "key": "attacker-key", "tenant": "attacker"}]}


def serve_and_measure(mode: str, trials: int, prompt_len: int, threads: int, keys: Path, seed: int) -> None:
    import uvicorn

    from pacer.server.app import create_app

    engine = LLM(num_threads=threads, kv_cache_memory="256MiB", tenant_isolation=mode).engine
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    service = build_service(parser.parse_args(["--port", "0", "--api-keys", str(keys)]), engine=engine)
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        results = run_trials(f"http://127.0.0.1:{port}", DEFAULT_MODEL_NAME, "victim-key", "attacker-key",
                             trials, prompt_len=prompt_len, seed=seed)
    finally:
        server.should_exit = True
        thread.join(30)
    tost = tost_paired(log_ratios(results), math.log(1.25))
    cached = statistics.fmean(t.t_cached for t in results) * 1e3
    fresh = statistics.fmean(t.t_fresh for t in results) * 1e3
    print(f"{mode:9s} attacker latency: victim's prompt {cached:7.1f} ms, fresh prompt {fresh:7.1f} ms "
          f"(ratio {cached / fresh:.3f}); cached tokens reported {max(t.cached_tokens for t in results)}; "
          f"loadavg {os.getloadavg()[0]:.2f}")
    print(f"{'':9s} log ratio TOST: {tost.line()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--prompt-len", type=int, default=320)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys.json"
        keys.write_text(json.dumps(KEYS))
        for seed, mode in enumerate(("isolated", "shared")):
            serve_and_measure(mode, args.trials, args.prompt_len, args.threads, keys, seed)


if __name__ == "__main__":
    main()

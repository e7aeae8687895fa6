"""`pacer diagnose`: sources -> records -> latency decomposition -> the bottleneck per class ->
the next experiment (with `--what-if` on the simulator). Rooms:

  records.py    Record / Source: what every input is read into
  sources.py    request log, bench/sim run files, CSV / JSONL tables (units, errors with line+column)
  prometheus.py a live pacer or vLLM /metrics endpoint over a window
  decompose.py  e2e = queue + prefill + decode + preemption, per request
  baseline.py   the request alone on the hardware (cost model), for the excess
  analysis.py   per class statistics and the bottleneck named with evidence
  recommend.py  the next experiment with flag values
  replay.py     a source as a trace; the sim / real-engine runs shared with `pacer tune`
  whatif.py     --what-if; render.py tables and --json; plots.py --plots; cli.py the command
"""

from pacer.diagnose.analysis import ClassReport, analyze
from pacer.diagnose.decompose import Parts, decompose
from pacer.diagnose.records import Record, Source
from pacer.diagnose.sources import load_source

__all__ = ["ClassReport", "Parts", "Record", "Source", "analyze", "decompose", "load_source"]

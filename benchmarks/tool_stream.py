"""Event-loop CPU to stream one long tool call, as a model writes it (one token per chunk).

    PYTHONPATH=src .venv/bin/python benchmarks/tool_stream.py [--tokens 4000]

A Hermes call whose arguments are `--tokens` pieces of about 4 characters, fed to the
server's streamed tool reader (pacer.server.tools.stream.ToolDeltaStream) one piece at a
time, then to the non-streamed parse of the whole text. Before issue 27 every chunk re-parsed
the text from its start (3.7 s for 4,000 tokens); the reader now reads each character once.
tests/security/test_bounds.py asserts the mechanism (work grows linearly); this prints time.
Nothing here asserts.
"""

from __future__ import annotations

import argparse
import time

from pacer.server.tools.parsers import HermesParser
from pacer.server.tools.stream import ToolDeltaStream


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4000, help="argument pieces (tokens) in the call")
    args = p.parse_args()
    pieces = ['<tool_call>\n{"name": "f", "arguments": {"text": "'] + [f"w{i % 97:02d} " for i in range(args.tokens)]
    pieces.append('"}}\n</tool_call>')
    parser = HermesParser(["f"])
    for n in (args.tokens // 4, args.tokens // 2, args.tokens):
        chunks = pieces[:n + 1] + pieces[-1:]
        stream = ToolDeltaStream(parser)
        start = time.perf_counter()
        for chunk in chunks:
            stream.update(chunk, final=False)
        stream.update("", final=True)
        streamed = time.perf_counter() - start
        start = time.perf_counter()
        parser.parse("".join(chunks))
        whole = time.perf_counter() - start
        print(f"{n:6d} tokens ({len(''.join(chunks)):6d} chars): streamed {streamed * 1e3:8.2f} ms "
              f"({streamed / len(chunks) * 1e6:6.1f} us/chunk), whole {whole * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()

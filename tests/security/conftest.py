"""The security suite (issue 27) runs on the server fixtures: real HTTP through uvicorn on
127.0.0.1, the session's default model (tests/server/conftest.py)."""

from __future__ import annotations

from tests.server.conftest import llm  # noqa: F401  (the session's model)

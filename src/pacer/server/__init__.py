"""OpenAI-compatible server: `pacer serve` (cli), the FastAPI app (app), the serving layer
(service), the engine thread (engine_loop), request parsing (protocol) and errors."""

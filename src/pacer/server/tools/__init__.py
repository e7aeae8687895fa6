"""Tool calling for the chat API: request fields (api), prompt rendering with tools
(template), output parsers `hermes` and `llama3_json` (parsers, json_scan), the message and
streamed deltas from one parse (stream), grammars for forced calls (grammar), and how the
server combines them per request (serving)."""

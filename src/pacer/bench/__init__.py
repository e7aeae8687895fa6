"""`pacer bench`: run a workload against an OpenAI-compatible server or an in-process engine
(`cli`), and the prefix-cache timing channel measured from a client's side (`timing_channel`).
What a run sends and how it is scored is `pacer.workload`."""

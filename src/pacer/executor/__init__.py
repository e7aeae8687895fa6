"""Executors run a SchedulerOutput: `ModelExecutor` on a real model, `SimExecutor` on a cost model."""

"""The asyncio shell around the engine: batcher, batch runner, executors, collate, decorator."""

"""The asyncio shell around the engine: batcher, executors, collate adapters, decorator."""

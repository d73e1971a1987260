"""The admission gate in front of a real LLM engine: an asyncio shell over
:class:`~adaptive_batcher.llm.core.GateCore`, engine adapters (OpenAI-compatible HTTP, in
process), engine telemetry, and an OpenAI-compatible gateway (ASGI app and command line).

The guide is docs/llm.md.
"""

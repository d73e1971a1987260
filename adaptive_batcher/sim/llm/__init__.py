"""The LLM simulator: a continuous-batching engine with vLLM V1's scheduling, step-time models,
token workloads, and replays of the admission gate in front of it.

Building blocks: :mod:`~adaptive_batcher.sim.llm.step_time` (roofline and closed-form step
times, device presets), :mod:`~adaptive_batcher.sim.llm.engine` (the engine),
:mod:`~adaptive_batcher.sim.llm.workloads` (token arrivals: the Azure LLM traces, Poisson,
steps, bursts), :mod:`~adaptive_batcher.sim.llm.simulator` and
:mod:`~adaptive_batcher.sim.llm.result` (a replay and what it measured),
:mod:`~adaptive_batcher.sim.llm.baselines` (TensorRT-LLM's dynamic batch tuner),
:mod:`~adaptive_batcher.sim.llm.scenarios` (the benchmark's contenders and searches) and
:mod:`~adaptive_batcher.sim.llm.report` (tables and plots).
"""

"""Discrete-event simulator: replays traffic against the real engine and controller.

Building blocks: :mod:`~adaptive_batcher.sim.service` (service-time and memory models),
:mod:`~adaptive_batcher.sim.workloads` (arrival processes), :mod:`~adaptive_batcher.sim.traces`
(public request traces), :mod:`~adaptive_batcher.sim.profiles` (the shipped H200 tables).
"""

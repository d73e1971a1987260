"""Discrete-event simulator: replays traffic against the real engine and controller.

Building blocks: :mod:`~adaptive_batcher.sim.service` (service-time and memory models),
:mod:`~adaptive_batcher.sim.workloads` (arrival processes), :mod:`~adaptive_batcher.sim.traces`
(public request traces), :mod:`~adaptive_batcher.sim.measured_tables` (the measured H200 and CPU
tables shipped as package data).
"""

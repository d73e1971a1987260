"""The spine: the sans-IO batcher that the runtime and the simulator both drive.

Its modules, each importing only those above it in this list and the shared leaves below the
spine (``errors``, ``slo``, ``_validate``, ``_log``, ``control``, ``metrics``, ``policies``,
``telemetry.base``); nothing in it imports a shell, the profiler or presets:

* :mod:`~adaptive_batcher.core.engine`: ``BatchingEngine``, the batching state machine
  (queue, batch formation, deadlines, execution slots): events with ``now`` in, actions out;
* :mod:`~adaptive_batcher.core.buckets`: bucket arithmetic (which size a batch is padded to,
  which sizes a warm-up runs);
* :mod:`~adaptive_batcher.core.settings`: ``BatcherSettings``, every setting checked once,
  with one name, one default and one message for the runtime, the simulator and presets;
* :mod:`~adaptive_batcher.core.batcher_core`: ``BatcherCore``, which joins the engine, the
  recorder and the controller by one set of rules, and is the shells' only way in.

The shells above it: the asyncio runtime (:mod:`adaptive_batcher.runtime`) and the simulator
(:mod:`adaptive_batcher.sim`).
"""

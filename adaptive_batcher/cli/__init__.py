"""The ``adaptive-batcher`` command: ``demo``, ``profile`` and ``replay``."""

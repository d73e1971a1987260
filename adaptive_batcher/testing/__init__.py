"""Public test doubles: fake models, a fake CUDA event and graph capture, fake telemetry.

Users test their own services with these as we test ours; nothing here needs a GPU.
"""

from adaptive_batcher.testing.cuda import EagerGraphCapture, FakeCudaEvent
from adaptive_batcher.testing.models import EchoModel
from adaptive_batcher.testing.nvml import FakePynvml
from adaptive_batcher.testing.telemetry import FakeTelemetry
from adaptive_batcher.testing.virtual_time import VirtualClockLoop, run_in_virtual_time

__all__ = [
    "EagerGraphCapture",
    "EchoModel",
    "FakeCudaEvent",
    "FakePynvml",
    "FakeTelemetry",
    "VirtualClockLoop",
    "run_in_virtual_time",
]

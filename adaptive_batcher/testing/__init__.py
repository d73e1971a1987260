"""Public test doubles: fake models, a fake CUDA event, fake telemetry.

Users test their own services with these as we test ours; nothing here needs a GPU.
"""

from adaptive_batcher.testing.cuda import FakeCudaEvent
from adaptive_batcher.testing.models import EchoModel
from adaptive_batcher.testing.nvml import FakePynvml
from adaptive_batcher.testing.telemetry import FakeTelemetry

__all__ = ["EchoModel", "FakeCudaEvent", "FakePynvml", "FakeTelemetry"]

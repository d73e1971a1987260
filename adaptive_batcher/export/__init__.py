"""Metrics where people look: Prometheus and OpenTelemetry exporters for ``AdaptiveBatcher``.

- :mod:`adaptive_batcher.export.prometheus`: ``register_prometheus(batcher, registry=None)``, a
  collector read at scrape time (``pip install "adaptive-batcher[prometheus]"``).
- :mod:`adaptive_batcher.export.otel`: ``instrument_otel(batcher, meter_provider=None)``,
  observable instruments read at collection time (``pip install "adaptive-batcher[otel]"``).
- :mod:`adaptive_batcher.export.readings`: what both publish, library-neutral.

Neither metrics library is a dependency of the package: ``import adaptive_batcher`` imports
neither, and importing an exporter without its library raises ``ImportError`` naming the extra
to install. The metrics, their units and their Ray Serve counterparts are listed in
``docs/metrics.md``.
"""

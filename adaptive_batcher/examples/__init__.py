"""Small models used by the demo, the profiler's examples and the tests (random weights, CPU)."""

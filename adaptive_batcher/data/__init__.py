"""Package data: measured tables shipped with the library (see ``h200/README.md``).

Read them with ``importlib.resources.files("adaptive_batcher.data") / "h200" / "<table>.csv"`` or,
parsed, with :func:`adaptive_batcher.sim.measured_tables.load_h200_table`.
"""

"""The GPU check: one script that exercises every GPU path of the library on a real device.

Entry point: ``python -m benchmarks.gpu.run_h200 --out DIR`` (see ``benchmarks/gpu/README.md``);
``--dry-run`` runs the same phases on the CPU with the project's public fakes for CUDA and NVML
(``tests/gpu_script/`` runs it so the script cannot rot).
"""

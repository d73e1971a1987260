"""Tests of the simulator and its building blocks."""

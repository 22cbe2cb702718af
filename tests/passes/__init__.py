"""Tests of tftpu.passes (space-to-depth, cost model)."""

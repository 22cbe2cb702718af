"""Tests of tftpu.graph (capture, surgery, pass manager, re-import, optimize)."""

"""Tests of the convert-layout pass, its op rules and the memory formats."""

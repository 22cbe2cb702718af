"""Command-line programs of tftpu, installed as the `tftpu_tools` package (see setup.py)."""

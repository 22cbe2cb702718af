"""The version of tftpu (read by the package root and written into the artefacts it makes)."""

__version__ = "0.1.0"

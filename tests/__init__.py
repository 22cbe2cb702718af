"""tftpu tests; tests/material.py fetches the real test material."""

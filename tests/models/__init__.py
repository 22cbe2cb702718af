"""Keras definitions of real models used as test material."""

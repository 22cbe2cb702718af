"""Files bundled with tftpu: a sample photo for the demo (see LICENSE-scikit-image.txt)."""

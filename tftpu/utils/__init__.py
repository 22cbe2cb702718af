"""Small helpers shared across tftpu: progress display, atomic file writes."""

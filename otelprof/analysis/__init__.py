"""Offline analysis of run recordings: each topic its own module returning frozen results."""

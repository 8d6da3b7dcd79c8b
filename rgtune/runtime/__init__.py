"""rgtune.runtime."""

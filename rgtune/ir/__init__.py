"""rgtune.ir."""

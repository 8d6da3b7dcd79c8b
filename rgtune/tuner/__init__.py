"""rgtune.tuner."""

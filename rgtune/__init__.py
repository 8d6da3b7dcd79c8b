"""rgtune: an autotuning compiler for relational graph neural network layers."""

__version__ = "0.1.0"

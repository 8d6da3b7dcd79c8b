"""rgtune.codegen."""

"""rgtune.codegen.cpu."""

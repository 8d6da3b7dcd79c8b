"""rgtune.codegen.cuda."""

"""rgtune.search_spaces."""

"""Search spaces: the IR's knobs and the templates' schedule parameters as one space per workload."""

from rgtune.search_spaces.space import TARGETS, Point, SearchSpace

__all__ = ["TARGETS", "Point", "SearchSpace"]

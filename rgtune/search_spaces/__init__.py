"""Search spaces: the IR's knobs and the backend's schedule parameters as one space per workload."""

from rgtune.search_spaces.space import MODES, Point, SearchSpace

__all__ = ["MODES", "Point", "SearchSpace"]

"""Search spaces: the IR's knobs and the backend's schedule parameters as one space per workload."""

from rgtune.search_spaces.blocks import BlockSpaces
from rgtune.search_spaces.space import MODES, Point, SearchSpace

__all__ = ["MODES", "BlockSpaces", "Point", "SearchSpace"]

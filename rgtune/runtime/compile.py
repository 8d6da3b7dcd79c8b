"""``rgtune.compile``: a model (or program) compiled for a graph and schedule, as a callable layer.

Example:
    >>> import torch, rgtune
    >>> from rgtune.data.synthetic import random_graph
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> layer = rgtune.compile("rgcn", g, {"reorder.aggregate_first": "on"}, in_dim=8, out_dim=4)
    >>> params = layer.init_params(seed=0)
    >>> layer(torch.randn(30, 8), params).shape
    torch.Size([30, 4])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import torch

from rgtune.codegen.base import Backend, BackendError, BuiltProgram
from rgtune.ir.kernels import KernelProgram
from rgtune.ir.registry import build_model
from rgtune.ir.program import Program
from rgtune.runtime._lookup import resolve_backend
from rgtune.search_spaces.space import SearchSpace

if TYPE_CHECKING:
    from rgtune.data.graph import HeteroGraph


class CompiledLayer:
    """A layer's kernels built for one graph: ``layer(x, params) -> (num_nodes, out_features)``."""

    def __init__(self, kernels: KernelProgram, graph: "HeteroGraph", config: dict[str, Any], built: BuiltProgram) -> None:
        self.kernels = kernels
        self.graph = graph
        self.config = config
        self.built = built

    def __call__(self, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.built.run(x, params)

    def init_params(self, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """Random learnable params of the right shapes (for trying a layer out)."""
        from rgtune.codegen.reference import init_params

        return init_params(self.kernels, self.graph, dtype=dtype, seed=seed)

    @property
    def sources(self) -> dict[str, str]:
        return self.built.sources

    def __repr__(self) -> str:
        return f"CompiledLayer({self.kernels.name}, backend={self.built.backend}, {len(self.kernels.kernels)} kernels)"


def compile(program_or_model_name: Program | str, graph: "HeteroGraph", schedule: Mapping[str, Any] | None = None,
            backend: str | Backend = "auto", in_dim: int = 64, out_dim: int = 64, heads: int = 1,
            options: Mapping[str, Any] | None = None) -> CompiledLayer:
    """Compile a registered model (by name, with its ``options``; sizes from ``in_dim``/``out_dim``/``heads``)
    or an IR :class:`Program` for ``graph`` with ``schedule`` (IR and kernel knobs; defaults fill
    the rest) on ``backend`` (``"auto"``: cuda where a GPU is usable, else cpu). An invalid schedule raises
    :class:`BackendError` with the reasons."""
    program = (build_model(program_or_model_name, in_dim, out_dim, heads, options)
               if isinstance(program_or_model_name, str) else program_or_model_name)
    be = resolve_backend(backend)
    point = SearchSpace(program, graph, be.target, precision="any").compile(dict(schedule or {}))
    if not point.valid:
        raise BackendError("invalid schedule: " + "; ".join(point.problems))
    return CompiledLayer(point.kernels, graph, point.config, be.build(point.kernels, graph, point.config))

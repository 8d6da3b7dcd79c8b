"""Graphs and datasets: :class:`HeteroGraph`, the loaders, and DGL/PyG interop.

This package knows nothing else of rgtune.
"""

from rgtune.data.graph import CSR, CanonicalEType, EdgeLayout, GraphStats, HeteroGraph, NodeTask, UniquePairs
from rgtune.data.interop import as_hetero_graph, from_dgl, from_pyg, to_dgl, to_pyg, to_pyg_homogeneous
from rgtune.data.stored import load_graph_file, save_graph_file, store_graph
from rgtune.data.synthetic import SyntheticSpecError, describe_presets, load_synthetic, random_graph
from rgtune.data.datasets import DATASETS, DatasetInfo, dataset_info, list_datasets, load_dataset
from rgtune.data.errors import (
    ChecksumError,
    CorruptDatasetError,
    DatasetError,
    DatasetNotFoundError,
    UnknownDatasetError,
)

__all__ = ["CSR", "CanonicalEType", "EdgeLayout", "GraphStats", "HeteroGraph", "NodeTask", "UniquePairs"]
__all__ += ["as_hetero_graph", "from_dgl", "from_pyg", "to_dgl", "to_pyg", "to_pyg_homogeneous"]
__all__ += ["load_graph_file", "save_graph_file", "store_graph"]
__all__ += ["SyntheticSpecError", "describe_presets", "load_synthetic", "random_graph"]
__all__ += ["DATASETS", "DatasetInfo", "dataset_info", "list_datasets", "load_dataset"]
__all__ += ["ChecksumError", "CorruptDatasetError", "DatasetError", "DatasetNotFoundError", "UnknownDatasetError"]

"""Entity classification on AIFB with PyG's ``RGCNConv``, in the style of PyG's ``examples/rgcn.py``; one
import line makes it rgtune's.

    python docs/examples/pyg_rgcn_aifb.py --impl pyg       # from torch_geometric.nn import RGCNConv
    python docs/examples/pyg_rgcn_aifb.py --impl rgtune    # from rgtune.nn.pyg import RGCNConv

Everything but that import is PyG's usual script: two ``RGCNConv`` layers (16 hidden units, 30 bases),
Adam with weight decay, 50 full-graph epochs. Two differences from PyG's example, both for rgtune's sake:
the nodes have a learnt 16-dimensional embedding as their features (PyG's example gives the first layer
``x=None`` and ``in_channels=num_nodes``: the same thing, its weight is the embedding; rgtune's RGCNConv
takes features), and the graph comes from rgtune's AIFB loader (PyG's ``Entities`` downloads it) in
PyG's homogeneous form (``edge_index``, ``edge_type``). ``--init FILE`` starts from the weights saved in
FILE (saving them there first if it does not exist), so that both imports train from the same weights;
each epoch's loss and time are printed, and ``--json`` writes them (with the process's peak memory).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rgtune.data import load_dataset, to_pyg_homogeneous

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--impl", choices=("pyg", "rgtune"), default="rgtune")
parser.add_argument("--epochs", type=int, default=50)
parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: torch's)")
parser.add_argument("--init", type=Path, default=None, help="initial weights: loaded, or saved when missing")
parser.add_argument("--json", type=Path, default=None, help="write the losses and epoch times here")
args = parser.parse_args()

if args.impl == "rgtune":
    from rgtune.nn.pyg import RGCNConv  # the only line that differs from a PyG script
else:
    from torch_geometric.nn import RGCNConv

    import torch_geometric  # without pyg-lib, the per-relation path (PyG's segment matmul averages otherwise)
    torch_geometric.backend.use_segment_matmul = False

if args.threads:
    torch.set_num_threads(args.threads)
graph = load_dataset("aifb")
edge_index, edge_type, num_nodes = to_pyg_homogeneous(graph)
task = graph.task
offset = int(graph.node_offsets[graph.ntypes.index(task.category)])  # the category's rows in the global order
train_idx, train_y = task.train_idx + offset, task.train_labels.long()
test_idx, test_y = task.test_idx + offset, task.test_labels.long()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(num_nodes, 16)
        self.conv1 = RGCNConv(16, 16, graph.num_rels, num_bases=30)
        self.conv2 = RGCNConv(16, task.num_classes, graph.num_rels, num_bases=30)

    def forward(self, edge_index: torch.Tensor, edge_type: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(self.emb.weight, edge_index, edge_type))
        return self.conv2(x, edge_index, edge_type)


torch.manual_seed(0)
model = Net()
if args.init is not None:
    if args.init.exists():
        model.load_state_dict(torch.load(args.init))
    else:
        torch.save(model.state_dict(), args.init)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.0005)


def train() -> float:
    model.train()
    optimizer.zero_grad()
    out = model(edge_index, edge_type)
    loss = F.nll_loss(F.log_softmax(out[train_idx], dim=1), train_y)
    loss.backward()
    optimizer.step()
    return loss.item()


@torch.no_grad()
def test() -> tuple[float, float]:
    model.eval()
    pred = model(edge_index, edge_type).argmax(dim=-1)
    return (float((pred[train_idx] == train_y).float().mean()), float((pred[test_idx] == test_y).float().mean()))


losses, times = [], []
for epoch in range(1, args.epochs + 1):
    start = time.perf_counter()
    loss = train()
    times.append(time.perf_counter() - start)
    losses.append(loss)
    train_acc, test_acc = test()
    print(f"Epoch: {epoch:02d}, Loss: {loss:.4f}, Train: {train_acc:.4f}, Test: {test_acc:.4f}, "
          f"Time: {times[-1] * 1e3:.1f} ms")
if args.json is not None:
    import resource

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the process's peak resident memory
    args.json.write_text(json.dumps({"impl": args.impl, "losses": losses, "epoch_s": times, "peak_mb": peak_mb,
                                     "train_acc": train_acc, "test_acc": test_acc}))

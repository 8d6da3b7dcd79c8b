"""Entity classification on AIFB with DGL's ``HeteroGraphConv`` of one ``GATConv`` per relation, in the style of
DGL's heterograph examples; one import line makes it rgtune's.

    python docs/examples/dgl_gat_aifb.py --impl dgl       # from dgl.nn import HeteroGraphConv, GATConv
    python docs/examples/dgl_gat_aifb.py --impl rgtune    # from rgtune.nn.dgl import HeteroGraphConv, GATConv

Everything but that import is DGL's usual script: the heterograph (rgtune's AIFB loader converted with
``rgtune.data.to_dgl``; DGL's ``AIFBDataset`` downloads it), a learnt 16-dimensional embedding per node type,
two ``HeteroGraphConv`` layers summing a ``GATConv`` per canonical edge type (2 heads of 8, then one head of the
classes), Adam, full-graph epochs. ``--init FILE`` starts from the weights saved in FILE (saving them first if it
does not exist), so that both imports train from the same weights; each epoch's loss and time are printed, and
``--json`` writes them with the process's peak memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rgtune.data import load_dataset, to_dgl

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--impl", choices=("dgl", "rgtune"), default="rgtune")
parser.add_argument("--epochs", type=int, default=50)
parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: torch's)")
parser.add_argument("--init", type=Path, default=None, help="initial weights: loaded, or saved when missing")
parser.add_argument("--json", type=Path, default=None, help="write the losses and epoch times here")
args = parser.parse_args()

if args.impl == "rgtune":
    from rgtune.nn.dgl import GATConv, HeteroGraphConv  # the only line that differs from a DGL script
else:
    from dgl.nn import GATConv, HeteroGraphConv

if args.threads:
    torch.set_num_threads(args.threads)
graph = load_dataset("aifb")
hg = to_dgl(graph)
task = graph.task
category = task.category
train_idx, train_y = task.train_idx, task.train_labels.long()
test_idx, test_y = task.test_idx, task.test_labels.long()


class GAT(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.ModuleDict({t: torch.nn.Embedding(hg.num_nodes(t), 16) for t in hg.ntypes})
        self.conv1 = HeteroGraphConv({c: GATConv(16, 8, 2) for c in hg.canonical_etypes}, aggregate="sum")
        self.conv2 = HeteroGraphConv({c: GATConv(16, task.num_classes, 1) for c in hg.canonical_etypes},
                                     aggregate="sum")

    def forward(self) -> torch.Tensor:
        h = self.conv1(hg, {t: e.weight for t, e in self.emb.items()})
        h = {t: F.relu(v.flatten(1)) for t, v in h.items()}
        return self.conv2(hg, h)[category].flatten(1)


torch.manual_seed(0)
model = GAT()
if args.init is not None:
    if args.init.exists():
        model.load_state_dict(torch.load(args.init))
    else:
        torch.save(model.state_dict(), args.init)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.0005)

losses, times = [], []
for epoch in range(1, args.epochs + 1):
    start = time.perf_counter()
    model.train()
    logits = model()
    loss = F.cross_entropy(logits[train_idx], train_y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    times.append(time.perf_counter() - start)
    losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        test_acc = float((model()[test_idx].argmax(1) == test_y).float().mean())
    print(f"Epoch: {epoch:02d}, Loss: {losses[-1]:.4f}, Test: {test_acc:.4f}, Time: {times[-1] * 1e3:.1f} ms")
if args.json is not None:
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    args.json.write_text(json.dumps({"impl": args.impl, "losses": losses, "epoch_s": times, "peak_mb": peak_mb,
                                     "test_acc": test_acc}))

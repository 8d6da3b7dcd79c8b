"""Entity classification on AIFB with DGL's ``HGTConv``, in the style of DGL's examples; one import line
makes it rgtune's.

    python docs/examples/dgl_hgt_aifb.py --impl dgl       # from dgl.nn import HGTConv
    python docs/examples/dgl_hgt_aifb.py --impl rgtune    # from rgtune.nn.dgl import HGTConv

Everything but that import is DGL's usual script: the heterograph (rgtune's AIFB loader converted with
``rgtune.data.to_dgl``; DGL's ``AIFBDataset`` downloads it) made homogeneous with its node and edge types
(``dgl.to_homogeneous``), a learnt 16-dimensional node embedding, two ``HGTConv`` layers (2 heads of 8,
DGL's default dropout 0.2), a linear classifier, Adam, full-graph epochs. ``--init FILE`` starts from the
weights saved in FILE (saving them first if it does not exist), so that both imports train from the same
weights (and the same dropout masks); each epoch's loss and time are printed, and ``--json`` writes them
with the process's peak memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import dgl
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
    from rgtune.nn.dgl import HGTConv  # the only line that differs from a DGL script
else:
    from dgl.nn import HGTConv

if args.threads:
    torch.set_num_threads(args.threads)
graph = load_dataset("aifb")
hg = to_dgl(graph)
g = dgl.to_homogeneous(hg)
ntypes, etypes = g.ndata[dgl.NTYPE], g.edata[dgl.ETYPE]
task = graph.task
target = hg.ntypes.index(task.category)
category_nodes = torch.nonzero(ntypes == target).flatten()  # the category's nodes, in its own order
train_idx, train_y = category_nodes[task.train_idx], task.train_labels.long()
test_idx, test_y = category_nodes[task.test_idx], task.test_labels.long()
num_ntypes, num_etypes = len(hg.ntypes), len(hg.canonical_etypes)


class HGT(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(g.num_nodes(), 16)
        self.conv1 = HGTConv(16, 8, 2, num_ntypes, num_etypes)
        self.conv2 = HGTConv(16, 8, 2, num_ntypes, num_etypes)
        self.out = torch.nn.Linear(16, task.num_classes)

    def forward(self) -> torch.Tensor:
        x = F.relu(self.conv1(g, self.emb.weight, ntypes, etypes))
        return self.out(self.conv2(g, x, ntypes, etypes))


torch.manual_seed(0)
model = HGT()
if args.init is not None:
    if args.init.exists():
        model.load_state_dict(torch.load(args.init))
    else:
        torch.save(model.state_dict(), args.init)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.0005)

torch.manual_seed(1)  # the dropout masks
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

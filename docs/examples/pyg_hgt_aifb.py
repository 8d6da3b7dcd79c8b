"""Entity classification on AIFB with PyG's ``HGTConv``, in the style of PyG's ``examples/hetero/hgt_dblp.py``;
one import line makes it rgtune's.

    python docs/examples/pyg_hgt_aifb.py --impl pyg       # from torch_geometric.nn import HGTConv
    python docs/examples/pyg_hgt_aifb.py --impl rgtune    # from rgtune.nn.pyg import HGTConv

Everything but that import is PyG's usual heterogeneous script: a ``HeteroData`` (rgtune's AIFB loader
converted with ``rgtune.data.to_pyg``; PyG's ``Entities`` downloads it), a learnt 16-dimensional embedding
per node type (AIFB has no features), two ``HGTConv`` layers (2 heads) and a linear classifier of the
``Personen`` nodes, Adam, full-graph epochs. ``--init FILE`` starts from the weights saved in FILE (saving
them there first if it does not exist), so that both imports train from the same weights; each epoch's
loss and time are printed, and ``--json`` writes them with the process's peak memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rgtune.data import load_dataset, to_pyg

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--impl", choices=("pyg", "rgtune"), default="rgtune")
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: torch's)")
parser.add_argument("--init", type=Path, default=None, help="initial weights: loaded, or saved when missing")
parser.add_argument("--json", type=Path, default=None, help="write the losses and epoch times here")
args = parser.parse_args()

if args.impl == "rgtune":
    from rgtune.nn.pyg import HGTConv  # the only line that differs from a PyG script
else:
    from torch_geometric.nn import HGTConv

if args.threads:
    torch.set_num_threads(args.threads)
data = to_pyg(load_dataset("aifb"))
category = "Personen"
store = data[category]


class HGT(torch.nn.Module):
    def __init__(self, hidden: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.emb = torch.nn.ModuleDict({t: torch.nn.Embedding(data[t].num_nodes, hidden) for t in data.node_types})
        self.convs = torch.nn.ModuleList([HGTConv(hidden, hidden, data.metadata(), heads) for _ in range(2)])
        self.lin = torch.nn.Linear(hidden, data.num_classes)

    def forward(self, edge_index_dict: dict) -> torch.Tensor:
        x_dict = {t: emb.weight for t, emb in self.emb.items()}
        for conv in self.convs:
            x_dict = {t: F.relu(x) for t, x in conv(x_dict, edge_index_dict).items() if x is not None}
        return self.lin(x_dict[category])


torch.manual_seed(0)
model = HGT()
if args.init is not None:
    if args.init.exists():
        model.load_state_dict(torch.load(args.init))
    else:
        torch.save(model.state_dict(), args.init)
optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=0.001)


def train() -> float:
    model.train()
    optimizer.zero_grad()
    out = model(data.edge_index_dict)
    loss = F.cross_entropy(out[store.train_idx], store.train_y)
    loss.backward()
    optimizer.step()
    return loss.item()


@torch.no_grad()
def test() -> float:
    model.eval()
    pred = model(data.edge_index_dict).argmax(dim=-1)
    return float((pred[store.test_idx] == store.test_y).float().mean())


losses, times = [], []
for epoch in range(1, args.epochs + 1):
    start = time.perf_counter()
    loss = train()
    times.append(time.perf_counter() - start)
    losses.append(loss)
    test_acc = test()
    print(f"Epoch: {epoch:02d}, Loss: {loss:.4f}, Test: {test_acc:.4f}, Time: {times[-1] * 1e3:.1f} ms")
if args.json is not None:
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    args.json.write_text(json.dumps({"impl": args.impl, "losses": losses, "epoch_s": times, "peak_mb": peak_mb,
                                     "test_acc": test_acc}))

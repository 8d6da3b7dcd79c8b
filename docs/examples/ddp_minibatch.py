"""Data-parallel mini-batch training of rgtune layers under torch's DistributedDataParallel.

    python docs/examples/ddp_minibatch.py --world-size 2                   # 2 processes, gloo, CPU
    python docs/examples/ddp_minibatch.py --world-size 2 --device cuda     # NCCL, a GPU per process
    python docs/examples/ddp_minibatch.py --world-size 2 --single          # the same steps in one process

Each process (rank) draws its own batches: its share of the seed nodes, sampled with its own seed by
rgtune's NeighborLoader. DistributedDataParallel broadcasts rank 0's initial weights and averages the
gradients over the ranks after every backward; nothing in this script is rgtune-specific but the layers
(``rgtune.runtime.Layer``) and the sampler. ``--single`` runs the same steps in one process over the union
of the ranks' batches (each step's loss the mean of theirs): the parameters it ends with are those every
rank ends with (the test ``tests/test_ddp.py`` checks it). ``--out DIR`` saves each rank's final
parameters as ``DIR/rank<r>.pt`` (``DIR/single.pt`` with ``--single``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from rgtune.data import load_dataset
from rgtune.data.graph import HeteroGraph
from rgtune.data.sampling import MiniBatch, NeighborLoader
from rgtune.runtime import Layer


class Net(nn.Module):
    """Two rgtune layers (a ReLU between them) and a linear classifier of the seed type's nodes."""

    def __init__(self, model: str, graph: HeteroGraph, features: int, hidden: int, classes: int, backend: str,
                 seed_type: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(model, graph, d_in, hidden, backend=backend, mode="training")
                                    for d_in in (features, hidden))
        self.head = nn.Linear(hidden, classes)
        self.seed_type = seed_type

    def forward(self, x: dict[str, torch.Tensor], mb: MiniBatch) -> torch.Tensor:
        h = self.layers[0](x, mb.blocks[0])
        h = self.layers[1]({t: torch.relu(v) for t, v in h.items()}, mb.blocks[1])
        return self.head(h[self.seed_type])


def setting(args: argparse.Namespace) -> tuple[HeteroGraph, dict[str, torch.Tensor], torch.Tensor, str]:
    """The graph, every node's features, the seed type's labels and that type (the same in every process:
    seeded)."""
    graph = load_dataset(args.dataset)
    gen = torch.Generator().manual_seed(0)
    feats = {t: torch.randn(graph.num_nodes(t), args.features, generator=gen) for t in graph.ntypes}
    seed_type = max(graph.ntypes, key=graph.num_nodes)
    labels = torch.randint(0, args.classes, (graph.num_nodes(seed_type),), generator=gen)
    return graph, feats, labels, seed_type


def loader(args: argparse.Namespace, graph: HeteroGraph, seed_type: str, rank: int) -> NeighborLoader:
    """Rank ``rank``'s batches: every ``world_size``-th seed node from ``rank`` on, its own sampling seed."""
    seeds = torch.arange(rank, graph.num_nodes(seed_type), args.world_size)
    return NeighborLoader(graph, args.fanouts, {seed_type: seeds}, batch_size=args.batch_size, seed=100 + rank)


def train(rank: int, args: argparse.Namespace) -> None:
    """One rank: DDP over the process group (gloo on CPUs, NCCL on GPUs), ``args.steps`` steps of SGD."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=args.world_size)
    device = torch.device(f"cuda:{rank}") if args.device == "cuda" else torch.device("cpu")
    torch.set_num_threads(args.threads)
    graph, feats, labels, seed_type = setting(args)
    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    net = Net(args.model, graph, args.features, args.hidden, args.classes, args.device if args.device == "cuda"
              else "cpu", seed_type).to(device)
    ddp = nn.parallel.DistributedDataParallel(net, device_ids=[rank] if args.device == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    batches = iter(loader(args, graph, seed_type, rank))
    for step in range(args.steps):
        mb = next(batches)
        x = {t: feats[t][mb.input_nodes[t]].to(device) for t in graph.ntypes}
        loss = nn.functional.cross_entropy(ddp(x, mb), labels[mb.seeds[seed_type]].to(device))
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks here
        opt.step()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.5f} (rank 0's batch)", flush=True)
    if args.out:
        torch.save({k: v.cpu() for k, v in net.state_dict().items()}, Path(args.out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def train_single(args: argparse.Namespace) -> None:
    """The same steps in one process: each step the ranks' batches, the loss the mean of theirs."""
    torch.set_num_threads(args.threads)
    graph, feats, labels, seed_type = setting(args)
    torch.manual_seed(0)
    net = Net(args.model, graph, args.features, args.hidden, args.classes, "cpu", seed_type)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    streams = [iter(loader(args, graph, seed_type, r)) for r in range(args.world_size)]
    for step in range(args.steps):
        losses: list[Any] = []
        for batches in streams:
            mb = next(batches)
            x = {t: feats[t][mb.input_nodes[t]] for t in graph.ntypes}
            losses.append(nn.functional.cross_entropy(net(x, mb), labels[mb.seeds[seed_type]]))
        loss = torch.stack(losses).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}: loss {losses[0].item():.5f} (rank 0's batch)", flush=True)
    if args.out:
        torch.save(net.state_dict(), Path(args.out) / "single.pt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--dataset", default="synthetic:custom,nodes=3000,edges=30000,ntypes=3,rels=6,seed=1")
    ap.add_argument("--model", default="rgcn", help="an rgtune model (rgcn, rgat, hgt, ...)")
    ap.add_argument("--world-size", type=int, default=2, help="processes (ranks)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: a GPU per rank, NCCL")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64, help="seed nodes per batch and rank")
    ap.add_argument("--fanouts", type=lambda s: [int(f) for f in s.split(",")], default=[10, 10],
                    help="per layer, first layer first (every relation)")
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--port", type=int, default=29511, help="the rendezvous port on 127.0.0.1")
    ap.add_argument("--single", action="store_true", help="the same steps in one process (see above)")
    ap.add_argument("--out", default=None, help="a folder for the final parameters")
    args = ap.parse_args()
    if args.single:
        train_single(args)
    else:
        mp.spawn(train, args=(args,), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()

"""Entity classification on AIFB, trained through rgtune's generated backward, beside PyG and DGL.

The model is the R-GCN paper's for entity classification (Schlichtkrull et al., 2018): a free
embedding per node (AIFB's nodes have no features; the paper feeds one-hot vectors, i.e. a free
vector per node), two relational layers (``hidden -> hidden``, ReLU, ``hidden -> classes``),
full-batch training with Adam (learning rate 0.01) for 50 epochs, 16 hidden units, no L2 penalty;
cross-entropy on the 140 labelled ``Personen`` of the training split, accuracy on the 36 of the
test split (one test node is 2.8 %). ``--model rgat`` / ``hgt`` use those layers instead (the
output layer with one head). The embedding is initialized per node type with Xavier-uniform
(ReLU gain), as DGL's R-GCN example does.

Implementations (``--impls``), each from the same initial weights per seed:

* ``rgtune``: layers from :func:`rgtune.load_tuned` with ``mode="training"``: the best training
  schedule of the database (each layer size tuned first with ``--tune-trials`` trials when it has
  none on this device); the forward saves what the backward reads, the backward runs the
  generated kernels on it (``backward_kind`` says so, printed per layer);
* ``torch``: the reference layers of :mod:`rgtune.models` (torch autograd);
* ``pyg`` / ``dgl``: the libraries' layers with the weights copied (:mod:`rgtune.bench.baselines`:
  where their math differs; a library layer that leaves a node type out gives it zeros).

Per implementation: test accuracy (mean and standard deviation over the seeds) and the median
epoch time (zero_grad, forward, loss, backward, Adam step; the first two epochs of each run left
out as warm-up). Seeds run one after another, the implementations interleaved within a seed.

Run::

    python experiments/train_aifb.py --seeds 5 --threads 2 --db sqlite:///bench.db
    python experiments/train_aifb.py --model hgt --seeds 5 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rgtune.data import DatasetError, HeteroGraph, load_dataset
from rgtune.models import HGT, RGAT, RGCN, RelationalLayer

DATASET = "aifb"
IMPLS = ("rgtune", "torch", "pyg", "dgl")
RESULTS = Path(__file__).resolve().parent / "results"


class EntityClassifier(nn.Module):
    """A free embedding per node, then relational layers with ReLU between them; logits per node."""

    def __init__(self, node_offsets: Sequence[int], embed: Tensor, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.embed = nn.Parameter(embed.clone())
        self.layers = nn.ModuleList(layers)

    def forward(self) -> Tensor:
        h = self.embed
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = F.relu(h)
        return h


class LibraryLayer(nn.Module):
    """A PyG or DGL layer (:class:`rgtune.bench.baselines.Baseline`) as a module over all nodes: rows
    the library leaves out (node types no relation points to) are zeros."""

    def __init__(self, run: Callable[[Tensor], Tensor], module: nn.Module, rows: Tensor | None, num_nodes: int,
                 out_dim: int) -> None:
        super().__init__()
        self.module, self.run, self.rows, self.num_nodes, self.out_dim = module, run, rows, num_nodes, out_dim

    def forward(self, x: Tensor) -> Tensor:
        out = self.run(x)
        if self.rows is None:
            return out
        return x.new_zeros(self.num_nodes, self.out_dim).index_copy(0, self.rows, out)


def initial_embedding(graph: HeteroGraph, dim: int) -> Tensor:
    """Xavier-uniform per node type (ReLU gain)."""
    out = torch.empty(graph.num_nodes(), dim)
    offs = graph.node_offsets.tolist()
    for a, b in zip(offs[:-1], offs[1:]):
        if b > a:
            nn.init.xavier_uniform_(out[a:b], gain=nn.init.calculate_gain("relu"))
    return out


def layer_sizes(model: str, hidden: int, classes: int, heads: int) -> list[tuple[int, int, int]]:
    """``(in, out, heads)`` of the two layers: hidden -> hidden -> classes (one head on the output)."""
    return [(hidden, hidden, heads if model != "rgcn" else 1), (hidden, classes, 1)]


def reference_layers(model: str, graph: HeteroGraph, sizes: list[tuple[int, int, int]]) -> list[RelationalLayer]:
    cls = {"rgcn": RGCN, "rgat": RGAT, "hgt": HGT}[model]
    return [cls(graph, i, o) if model == "rgcn" else cls(graph, i, o, heads=h) for i, o, h in sizes]


# ---------------------------------------------------------------------- the implementations' layers
def rgtune_layers(args: argparse.Namespace, graph: HeteroGraph, sizes: list[tuple[int, int, int]]) -> list[nn.Module]:
    """The tuned layers (training schedules), built once; each seed loads its weights into them."""
    from rgtune.runtime import load_tuned

    out = []
    for i, o, h in sizes:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            layer = load_tuned(args.model, graph, i, o, h, db=args.db, backend=args.backend, mode="training")
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
        prov = layer.provenance
        where = f"trial {prov['trial_id']}" if prov.get("trial_id") is not None else prov.get("source")
        print(f"rgtune layer {i}->{o} heads={h}: backend {layer.backend}, training schedule {where} "
              f"(autodiff.save={layer.training_config.get('autodiff.save')}), backward {layer.backward_kind}",
              file=sys.stderr)
        out.append(layer)
    return out


def ensure_tuned(args: argparse.Namespace, graph: HeteroGraph, sizes: list[tuple[int, int, int]]) -> None:
    """Tune each layer size without a training record on this device (``--tune-trials`` trials)."""
    from rgtune.db import TrialDatabase
    from rgtune.runtime._lookup import resolve_backend
    from rgtune.runtime.load import select_schedule
    from rgtune.tuner.measure import Workload
    from rgtune.tuner.study import TuneOptions, Tuner

    backend = resolve_backend(args.backend).name
    for i, o, h in sizes:
        sel = select_schedule(args.model, graph, i, o, h, args.db, backend, mode="training")
        if sel.missing is None and sel.provenance.get("same_device"):
            continue
        print(f"tuning {args.model} {i}->{o} heads={h} for training ({args.tune_trials} trials) ...", file=sys.stderr)
        s = Tuner(Workload(args.model, DATASET, i, o, h, backend, args.data_dir, mode="training"),
                  TrialDatabase(args.db), TuneOptions(trials=args.tune_trials, seed=0, progress=False)).run()
        print(f"  {s.trials_run} trials, best {s.best_ms}", file=sys.stderr)


def model_for(impl: str, refs: list[RelationalLayer], embed: Tensor, graph: HeteroGraph,
              tuned: list[nn.Module] | None) -> EntityClassifier:
    """``impl``'s network with the weights of ``refs`` and ``embed``."""
    from rgtune.bench.baselines import BUILDERS

    offsets = graph.node_offsets.tolist()
    if impl == "torch":
        return EntityClassifier(offsets, embed, refs)
    if impl == "rgtune":
        assert tuned is not None
        for layer, ref in zip(tuned, refs):
            layer.load_state_dict(ref.state_dict())
        return EntityClassifier(offsets, embed, tuned)
    model = next(m for m, c in (("rgcn", RGCN), ("rgat", RGAT), ("hgt", HGT)) if isinstance(refs[0], c))
    layers = []
    for ref in refs:
        b = BUILDERS[impl][model](ref)
        layers.append(LibraryLayer(b.run, b.module, b.rows, graph.num_nodes(), ref.out_dim))
    return EntityClassifier(offsets, embed, layers)


# ---------------------------------------------------------------------- training
@dataclass
class Run:
    accuracies: list[float] = field(default_factory=list)
    epoch_s: list[float] = field(default_factory=list)
    problem: str | None = None


def train(net: EntityClassifier, graph: HeteroGraph, args: argparse.Namespace) -> tuple[float, list[float]]:
    """Full-batch training; the test accuracy and every epoch's seconds."""
    task = graph.task
    assert task is not None
    train_ids, test_ids = graph.to_global(task.category, task.train_idx), graph.to_global(task.category, task.test_idx)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    times = []
    net.train()
    for _ in range(args.epochs):
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(net()[train_ids], task.train_labels.long()).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    net.eval()
    with torch.no_grad():
        pred = net()[test_ids].argmax(1)
    return float((pred == task.test_labels.long()).float().mean()), times


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("Run::")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rgcn", choices=("rgcn", "rgat", "hgt"))
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated subset of {','.join(IMPLS)}")
    p.add_argument("--data-dir", default=None, help="dataset root (default: $RGTUNE_DATA_DIR, else the user cache)")
    p.add_argument("--seeds", type=int, default=5, help="runs with seeds 0..N-1 (default 5)")
    p.add_argument("--backend", default="cpu", help="rgtune's backend: cpu (default), cuda, reference")
    p.add_argument("--db", default="results.db", help="trial database (default results.db)")
    p.add_argument("--tune-trials", type=int, default=0,
                   help="trials to tune a layer size without a training record on this device (default 0: don't)")
    p.add_argument("--hidden", type=int, default=16, help="embedding and hidden size (default 16, the paper's)")
    p.add_argument("--heads", type=int, default=1, help="heads of the hidden layer (rgat, hgt; default 1)")
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=None, help="torch/OpenMP threads")
    p.add_argument("--json", type=Path, default=RESULTS / "train_aifb.jsonl", help="JSON lines (appended)")
    args = p.parse_args(argv)
    impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    if sorted(set(impls) - set(IMPLS)) or args.seeds < 1 or args.epochs < 3:
        p.error(f"--impls must name some of {list(IMPLS)}; --seeds >= 1; --epochs >= 3")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        graph = load_dataset(DATASET, root=args.data_dir)
    except DatasetError as e:  # says where it looked and how to provide the files
        print(f"train_aifb: error: {e}", file=sys.stderr)
        return 1
    sizes = layer_sizes(args.model, args.hidden, graph.task.num_classes, args.heads)  # type: ignore[union-attr]
    tuned = None
    if "rgtune" in impls:
        if args.tune_trials > 0:
            ensure_tuned(args, graph, sizes)
        tuned = rgtune_layers(args, graph, sizes)
    runs = {impl: Run() for impl in impls}
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        refs, embed = reference_layers(args.model, graph, sizes), initial_embedding(graph, args.hidden)
        if args.model == "rgat":  # PyG's RGATConv shares attention vectors across relations
            from rgtune.bench.baselines import tie_rgat_attention
            for r in refs:
                tie_rgat_attention(r)
        state = [r.state_dict() for r in refs]
        for impl in impls:
            run = runs[impl]
            if run.problem:
                continue
            for r, s in zip(refs, state):
                r.load_state_dict(s)
            try:
                # the torch impl trains refs in place: every impl reloads the seed's weights first
                acc, times = train(model_for(impl, refs, embed, graph, tuned), graph, args)
            except Exception as e:  # noqa: BLE001 - a broken library is a line of the table, not a crash
                run.problem = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                continue
            run.accuracies.append(acc)
            run.epoch_s += times[2:]
            print(f"seed {seed} {impl}: test_accuracy={acc:.4f}, epoch {statistics.median(times[2:]) * 1e3:.1f} ms",
                  flush=True)
    report(runs, args)
    return 0


def report(runs: dict[str, Run], args: argparse.Namespace) -> None:
    print(f"\n{args.model} on {DATASET}, hidden {args.hidden}, {args.epochs} epochs, {args.seeds} seeds, "
          f"{torch.get_num_threads()} threads")
    print("| implementation | test accuracy (mean ± std) | epoch ms (median) | x rgtune |\n|---|---|---|---|")
    mine = statistics.median(runs["rgtune"].epoch_s) if "rgtune" in runs and runs["rgtune"].epoch_s else None
    rows = {}
    for impl, run in runs.items():
        if run.problem or not run.accuracies:
            print(f"| {impl} | {run.problem} | – | – |")
            continue
        acc = statistics.mean(run.accuracies)
        std = statistics.stdev(run.accuracies) if len(run.accuracies) > 1 else 0.0
        ms = statistics.median(run.epoch_s) * 1e3
        ratio = f"{ms / (mine * 1e3):.2f}" if mine else "–"
        print(f"| {impl} | {acc:.4f} ± {std:.4f} | {ms:.1f} | {ratio} |")
        rows[impl] = {"accuracies": run.accuracies, "epoch_ms_median": ms}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "a") as f:
        f.write(json.dumps({"model": args.model, "hidden": args.hidden, "epochs": args.epochs, "seeds": args.seeds,
                            "threads": torch.get_num_threads(), "backend": args.backend, "impls": rows,
                            "problems": {k: r.problem for k, r in runs.items() if r.problem}}) + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""Entity classification on AIFB (or MUTAG), trained through rgtune's generated backward, beside the torch layers, PyG and DGL.

Makes BENCHMARKS.md's table "Training a model". The R-GCN paper's model (Schlichtkrull et al., 2018): a free
embedding per node (Xavier-uniform per node type), two relational layers (hidden -> hidden, ReLU, hidden ->
classes), full-batch Adam (lr 0.01), 50 epochs, 16 hidden units; cross-entropy on AIFB's 140 training
`Personen`, accuracy on the 36 of the test split. Each implementation (--impls) starts from the same weights
per seed: `rgtune`, the layers of `load_tuned(mode="training")` (--db's best training schedule, else the
default one; the backward runs generated kernels); `rgtune_bf16` / `rgtune_fp16`, the same schedules with the
intermediates stored in bfloat16 / float16 (``precision.edges``, ``precision.nodes``; BENCHMARKS.md, "Mixed
precision");
`torch`, the reference layers of rgtune.torch_layers; `pyg` /
`dgl`, the libraries' layers with the weights copied (rgtune.bench.baselines; a node type a library leaves
out gets zeros). Reported: test accuracy over the seeds and the median epoch time (the first two epochs of
each run left out).

Examples::

    python experiments/train_aifb.py --seeds 5 --threads 2 --backend cpu --impls rgtune,torch,dgl
    python experiments/train_aifb.py --model hgt --seeds 5 --threads 2 --db sqlite:///bench.db
    python experiments/train_aifb.py --model rgat --dataset mutag --impls rgtune,rgtune_bf16,rgtune_fp16
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rgtune.data import DatasetError, HeteroGraph, load_dataset
from rgtune.torch_layers import HGT, RGAT, RGCN

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, append_jsonl, parser  # noqa: E402 - experiments/ is not a package

IMPLS = ("rgtune", "rgtune_bf16", "rgtune_fp16", "torch", "pyg", "dgl")
#: rgtune's variants: the storage type of the per-edge intermediates (``precision.edges``)
STORAGE = {"rgtune": "float32", "rgtune_bf16": "bfloat16", "rgtune_fp16": "float16"}
LAYERS = {"rgcn": RGCN, "rgat": RGAT, "hgt": HGT}


class EntityClassifier(nn.Module):
    """A free embedding per node, then the layers with ReLU between them; logits per node."""

    def __init__(self, embed: Tensor, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.embed, self.layers = nn.Parameter(embed.clone()), nn.ModuleList(layers)

    def forward(self) -> Tensor:
        h = self.embed
        for i, layer in enumerate(self.layers):
            h = layer(h) if i == 0 else layer(F.relu(h))
        return h


class LibraryLayer(nn.Module):
    """A PyG or DGL layer (a `rgtune.bench.baselines.Baseline`) over all nodes: rows it leaves out are zeros."""

    def __init__(self, baseline: Any, num_nodes: int, out_dim: int) -> None:
        super().__init__()
        self.module, self.b, self.shape = baseline.module, baseline, (num_nodes, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        out = self.b.run(x)
        return out if self.b.rows is None else x.new_zeros(self.shape).index_copy(0, self.b.rows, out)


def initial_embedding(graph: HeteroGraph, dim: int) -> Tensor:
    """Xavier-uniform per node type (ReLU gain)."""
    out = torch.empty(graph.num_nodes(), dim)
    offs = graph.node_offsets.tolist()
    for a, b in zip(offs[:-1], offs[1:]):
        if b > a:
            nn.init.xavier_uniform_(out[a:b], gain=nn.init.calculate_gain("relu"))
    return out


def rgtune_layers(args: Any, graph: HeteroGraph, sizes: list[tuple[int, int, int]], storage: str) -> list[nn.Module]:
    """The tuned layers (training schedules) with the per-edge intermediates stored as ``storage``, built once;
    each seed loads its weights into them."""
    from rgtune.runtime import Layer, load_tuned

    out = []
    for i, o, h in sizes:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            layer = load_tuned(args.model, graph, i, o, h, db=args.db, backend=args.backend, mode="training")
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
        low = {k: storage for k in ("precision.edges", "precision.nodes") if k in layer.training_config}
        if storage != "float32" and low:
            layer = Layer(args.model, graph, i, o, h, backend=args.backend, mode="training",
                          config={**layer.training_config, **low})
        where = layer.provenance.get("trial_id") or layer.provenance.get("source")
        print(f"rgtune layer {i}->{o} heads={h}: backend {layer.backend}, training schedule {where} (autodiff.save="
              f"{layer.training_config.get('autodiff.save')}), backward {layer.backward_kind}", file=sys.stderr)
        out.append(layer)
    return out


def network(impl: str, refs: list[nn.Module], embed: Tensor, graph: HeteroGraph, model: str,
            tuned: list[nn.Module] | None) -> EntityClassifier:
    """``impl``'s network with the weights of ``refs`` and ``embed``."""
    from rgtune.bench.baselines import BUILDERS
    from rgtune.runtime import Layer

    if impl == "torch" or impl in STORAGE:
        for layer, ref in zip(tuned or [], refs):
            layer.load_state_dict(ref.state_dict())
        return EntityClassifier(embed, refs if impl == "torch" else tuned or [])
    layers = []
    for ref in refs:  # a library's builder copies the weights of an rgtune Layer (the torch executor)
        src = Layer(model, graph, ref.in_dim, ref.out_dim, ref.heads, dtype=torch.float32)
        src.load_state_dict(ref.state_dict())
        layers.append(LibraryLayer(BUILDERS[impl][model](src), graph.num_nodes(), ref.out_dim))
    return EntityClassifier(embed, layers)


def train(net: EntityClassifier, graph: HeteroGraph, args: Any) -> tuple[float, list[float]]:
    """Full-batch training; the test accuracy and every epoch's seconds."""
    task = graph.task
    assert task is not None
    train_ids, test_ids = graph.to_global(task.category, task.train_idx), graph.to_global(task.category, task.test_idx)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    times = []
    for _ in range(args.epochs):
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(net()[train_ids], task.train_labels.long()).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    with torch.no_grad():
        return float((net()[test_ids].argmax(1) == task.test_labels.long()).float().mean()), times


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(__doc__, "data-dir", "hidden", hidden=16)
    p.add_argument("--model", default="rgcn", choices=tuple(LAYERS), help="the layers (default rgcn)")
    p.add_argument("--dataset", default="aifb", choices=("aifb", "mutag"), help="the task (default aifb)")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated subset of {','.join(IMPLS)} (default all)")
    p.add_argument("--seeds", type=int, default=5, help="runs with seeds 0..N-1 (default 5)")
    p.add_argument("--backend", default="cpu", help="rgtune's backend: cpu (default), cuda, reference")
    p.add_argument("--db", default="results.db", help="trial database of rgtune's schedules (default results.db)")
    p.add_argument("--heads", type=int, default=1, help="heads of the hidden layer (rgat, hgt; default 1)")
    p.add_argument("--epochs", type=int, default=50, help="default 50")
    p.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate (default 0.01)")
    p.add_argument("--threads", type=int, default=None, help="torch/OpenMP threads (default torch's)")
    p.add_argument("--json", type=Path, default=RESULTS / "train_aifb.jsonl", help="JSON lines (appended)")
    args = p.parse_args(argv)
    impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    if set(impls) - set(IMPLS) or args.seeds < 1 or args.epochs < 3:
        p.error(f"--impls must name some of {list(IMPLS)}; --seeds >= 1; --epochs >= 3")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        graph = load_dataset(args.dataset, root=args.data_dir)
    except DatasetError as e:  # says where it looked and how to provide the files
        p.exit(1, f"train_aifb: error: {e}\n")
    classes, heads = graph.task.num_classes, args.heads if args.model != "rgcn" else 1  # type: ignore[union-attr]
    sizes = [(args.hidden, args.hidden, heads), (args.hidden, classes, 1)]
    tuned = {i: rgtune_layers(args, graph, sizes, STORAGE[i]) for i in impls if i in STORAGE}
    accuracies: dict[str, list[float]] = {i: [] for i in impls}
    epoch_s: dict[str, list[float]] = {i: [] for i in impls}
    problems: dict[str, str] = {}
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        refs = [LAYERS[args.model](graph, i, o, **({} if args.model == "rgcn" else {"heads": h})) for i, o, h in sizes]
        embed = initial_embedding(graph, args.hidden)
        if args.model == "rgat":  # PyG's RGATConv shares attention vectors across relations
            from rgtune.bench.baselines import tie_rgat_attention
            for r in refs:
                tie_rgat_attention(r)
        state = [r.state_dict() for r in refs]
        for impl in (i for i in impls if i not in problems):
            for r, s in zip(refs, state):  # the torch network trains refs in place: every impl starts from the seed's
                r.load_state_dict(s)
            try:
                acc, times = train(network(impl, refs, embed, graph, args.model, tuned.get(impl)), graph, args)
            except Exception as e:  # noqa: BLE001 - a broken library is a line of the table, not a crash
                problems[impl] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
                continue
            accuracies[impl].append(acc)
            epoch_s[impl] += times[2:]
            print(f"seed {seed} {impl}: test_accuracy={acc:.4f}, epoch {statistics.median(times[2:]) * 1e3:.1f} ms",
                  flush=True)
    print(f"\n{args.model} on {args.dataset}, hidden {args.hidden}, {args.epochs} epochs, {args.seeds} seeds, "
          f"{torch.get_num_threads()} threads\n| implementation | test accuracy (mean ± std) | epoch ms (median) | "
          "x rgtune |\n|---|---|---|---|")
    mine = statistics.median(epoch_s["rgtune"]) if epoch_s.get("rgtune") else None
    for impl in impls:
        if impl in problems or not accuracies[impl]:
            print(f"| {impl} | {problems.get(impl)} | – | – |")
            continue
        acc, ms = accuracies[impl], statistics.median(epoch_s[impl]) * 1e3
        std = statistics.stdev(acc) if len(acc) > 1 else 0.0
        print(f"| {impl} | {statistics.mean(acc):.4f} ± {std:.4f} | {ms:.1f} | "
              f"{f'{ms / (mine * 1e3):.2f}' if mine else '–'} |")
    append_jsonl(args.json, {"model": args.model, "dataset": args.dataset, "hidden": args.hidden, "epochs": args.epochs, "seeds": args.seeds,
                             "threads": torch.get_num_threads(), "backend": args.backend, "problems": problems,
                             "impls": {i: {"accuracies": accuracies[i], "epoch_ms_median": statistics.median(
                                 epoch_s[i]) * 1e3} for i in impls if i not in problems and accuracies[i]}})
    return 0


if __name__ == "__main__":
    sys.exit(main())

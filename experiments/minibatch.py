"""Mini-batch training, side by side: rgtune against PyG and DGL on the same sampled batches (BENCHMARKS.md,
"Mini-batch training").

Two layers (RGCN or HGT, hidden -> hidden), a ReLU between them and a linear head, trained with Adam
on a node classification of the seed type; every implementation gets the same batches (rgtune's
:class:`~rgtune.data.sampling.NeighborLoader`: PyG's ``NeighborLoader`` needs pyg-lib or torch-sparse,
which do not install here; DGL gets the same blocks, converted), the same initial weights (rgtune's,
copied), the same features and labels. Each implementation runs in a process of its own. Per step:

* ``sample``: drawing the batch (the same sampler for all);
* ``prep``: what the implementation does with a new batch before its forward: rgtune binds its compiled
  kernels to the batch (:meth:`rgtune.runtime.Layer.bind`: the batch's index arrays and tables), PyG
  and DGL build their graph objects (edge indices, a DGL block, RGCN's per-relation mean normalization);
* ``model``: forward, loss, backward, optimizer step (what the user calls);
* ``step``: all of it, with the gather of the input features.

Medians over the steps after ``--warmup``; ``peak_mb``: the process's resident-set high-water mark
above its state after loading the graph. ``--losses`` also prints each step's loss (the same batches
and weights give the same curve where the math is the same: rgtune and PyG).

    python experiments/minibatch.py --dataset synthetic:ogbn-mag --models rgcn,hgt --impls rgtune,pyg,dgl \\
        --steps 20 --warmup 3 --fanouts 15,10 --batch-size 1024 --hidden 64 --threads 2 \\
        --json experiments/results/minibatch.jsonl
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_jsonl, parser  # noqa: E402 - experiments/ is not a package

IMPLS = ("rgtune", "pyg", "dgl", "rgtune-sampler")


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--dataset", default="aifb")
    ap.add_argument("--models", default="rgcn,hgt")
    ap.add_argument("--impls", default="rgtune,pyg,dgl",
                    help="rgtune (--config, else --db's best whole-graph schedule, else the default one), pyg, dgl, "
                         "rgtune-sampler (--db's schedule tuned for this sampler: tune --batches)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--fanouts", default="15,10", help="per layer, first layer first (per relation)")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2, help="HGT's heads")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--db", default=None, help="a trial database: rgtune loads its best training schedule from it")
    ap.add_argument("--config", default=None,
                    help="rgtune's schedule, knob=value pairs joined by commas (e.g. reorder.aggregate_first=on); "
                         "default: every knob's default (or --db's best)")
    ap.add_argument("--seed-type", default=None, help="the node type classified (default: the task's, else the type "
                                                      "with the most in-edges) with random labels when no task")
    ap.add_argument("--sample-seed", type=int, default=0,
                    help="the loader's seed (tune --batches times the first batches of seed 0: 1 gives fresh ones)")
    ap.add_argument("--losses", action="store_true", help="print every step's loss")
    ap.add_argument("--json", default=None, help="append one row per model and implementation (JSON lines)")
    ap.add_argument("--one", default=None, help=argparse_hidden())
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args)))
        return 0
    for model in args.models.split(","):
        rows = []
        for impl in args.impls.split(","):
            cmd = [sys.executable, __file__, "--one", f"{model}/{impl}", *_passthrough(args)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{model} {impl}: failed\n{r.stderr[-2000:]}", file=sys.stderr)
                continue
            row = json.loads(r.stdout.strip().splitlines()[-1])
            rows.append(row)
            if args.json:
                append_jsonl(Path(args.json), row)
        _print_table(model, rows, args.losses)
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


def _passthrough(args: Any) -> list[str]:
    out = []
    for name in ("dataset", "steps", "warmup", "fanouts", "batch_size", "hidden", "heads", "threads", "db", "config",
                 "seed_type", "sample_seed"):
        v = getattr(args, name)
        if v is not None:
            out += [f"--{name.replace('_', '-')}", str(v)]
    return out


def _print_table(model: str, rows: list[dict[str, Any]], losses: bool) -> None:
    print(f"\n{model}: median ms per step (and peak MB above the loaded graph)")
    print(f"{'impl':8} {'sample':>8} {'prep':>8} {'model':>8} {'step':>8} {'peak MB':>9}")
    for r in rows:
        print(f"{r['impl']:8} {r['sample_ms']:8.1f} {r['prep_ms']:8.1f} {r['model_ms']:8.1f} {r['step_ms']:8.1f} "
              f"{r['peak_mb']:9.0f}")
    if losses:
        for r in rows:
            print(r["impl"], " ".join(f"{v:.6f}" for v in r["losses"]))


# ------------------------------------------------------------------ one implementation, in its own process
def run_one(spec: str, args: Any) -> dict[str, Any]:
    import torch

    from rgtune.data import load_dataset
    from rgtune.tuner.memory import reset_peak, status_bytes

    model, impl = spec.split("/")
    torch.set_num_threads(args.threads)
    g = load_dataset(args.dataset)
    sampler = _sampler(args)
    seed_type = sampler.seed_type(g)
    num_classes = g.task.num_classes if g.task is not None else 16
    labels = torch.zeros(g.num_nodes(seed_type), dtype=torch.int64)
    if g.task is not None:
        labels[g.task.train_idx] = g.task.train_labels.long()
    else:
        labels = torch.randint(num_classes, (g.num_nodes(seed_type),), generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    feats = {t: torch.randn(g.num_nodes(t), args.hidden, generator=gen) for t in g.ntypes}
    net = _network(impl, model, g, args, num_classes)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    batches = iter(_forever(sampler.loader(g)))
    reset_peak()
    base = status_bytes("VmHWM") or 0
    times, losses, edges = [], [], []
    for _ in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        mb = next(batches)
        t1 = time.perf_counter()
        x = {t: feats[t][mb.input_nodes[t]] for t in g.ntypes}
        y = labels[mb.seeds[seed_type]]
        t2 = time.perf_counter()
        net.prepare(mb)
        t3 = time.perf_counter()
        out = net(x, mb)
        loss = torch.nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t4 = time.perf_counter()
        times.append((t1 - t0, t3 - t2, t4 - t3, t4 - t0))
        losses.append(float(loss))
        edges.append(mb.num_edges)
    kept = times[args.warmup:]
    med = [statistics.median(t[i] for t in kept) * 1e3 for i in range(4)]
    peak = ((status_bytes("VmHWM") or 0) - base) / 2**20
    return {"model": model, "impl": impl, "dataset": args.dataset, "fanouts": list(sampler.fanouts),
            "batch_size": args.batch_size, "sample_seed": args.sample_seed, "schedule": net.schedule,
            "hidden": args.hidden, "threads": args.threads, "steps": args.steps, "sample_ms": med[0], "prep_ms": med[1],
            "model_ms": med[2], "step_ms": med[3], "peak_mb": peak, "losses": losses,
            "edges_per_step": statistics.median(edges)}


def _sampler(args: Any) -> Any:
    """The sampler every implementation draws from (and the one ``tune --batches`` names)."""
    from rgtune.data.sampler_spec import SamplerSpec

    return SamplerSpec(tuple(int(f) for f in args.fanouts.split(",")), args.batch_size, seed_type_name=args.seed_type,
                       seed=args.sample_seed)


def _forever(loader: Any) -> Any:
    while True:
        yield from loader


def _network(impl: str, model: str, g: Any, args: Any, num_classes: int) -> Any:
    """Two layers, ReLU, a linear head; every implementation with rgtune's initial weights."""
    import torch

    from rgtune.runtime import Layer

    torch.manual_seed(0)
    heads = 1 if model == "rgcn" else args.heads
    if args.db and (impl == "rgtune-sampler" or (impl == "rgtune" and not args.config)):
        from rgtune.runtime import load_tuned

        batches = _sampler(args).key if impl == "rgtune-sampler" else None
        ours = [load_tuned(model, g, args.hidden, args.hidden, heads, db=args.db, backend="cpu", mode="training",
                           batches=batches) for _ in range(2)]
    else:
        config = dict(kv.split("=", 1) for kv in args.config.split(",")) if args.config else None
        ours = [Layer(model, g, args.hidden, args.hidden, heads, backend="cpu", mode="training", config=config)
                for _ in range(2)]
    head = torch.nn.Linear(args.hidden, num_classes)
    seed_type = _sampler(args).seed_type(g)
    if impl in ("rgtune", "rgtune-sampler"):
        return _Rgtune(ours, head, seed_type)
    if impl == "pyg":
        return _Pyg(model, ours, head, seed_type)
    if impl == "dgl":
        return _Dgl(model, ours, head, seed_type)
    raise ValueError(f"unknown implementation {impl!r}; choose from {IMPLS}")


class _Net:
    schedule: Any = None  # rgtune's: the trial its schedule came from, or where else

    def __init__(self, layers: list[Any], head: Any, seed_type: str) -> None:
        import torch

        self.layers = torch.nn.ModuleList(layers)
        self.head, self.seed_type = head, seed_type

    def parameters(self) -> Any:
        return [*self.layers.parameters(), *self.head.parameters()]


class _Rgtune(_Net):
    @property
    def schedule(self) -> Any:
        p = self.layers[0].provenance
        return f"trial {p['trial_id']}" if p.get("trial_id") is not None else p.get("source")

    def prepare(self, mb: Any) -> None:
        for i, (layer, block) in enumerate(zip(self.layers, mb.blocks)):
            layer.bind(block, input_grad=i > 0)  # the features need no gradient: the first layer's params' alone

    def __call__(self, x: dict[str, Any], mb: Any) -> Any:
        import torch

        h = self.layers[0](x, mb.blocks[0])
        h = {t: torch.relu(v) for t, v in h.items()}
        return self.head(self.layers[1](h, mb.blocks[1])[self.seed_type])


class _Pyg(_Net):
    """PyG's ``RGCNConv`` on each block as a bipartite graph (sources, destinations: the prefix), or its
    ``HGTConv`` on each block as a heterogeneous graph of its sources (PyG computes every source's output
    and the destinations are the first of each type: a NeighborLoader batch's usual use)."""

    def __init__(self, model: str, layers: list[Any], head: Any, seed_type: str) -> None:
        from rgtune.bench.baselines import _pyg
        from rgtune.torch_layers.pyg import to_pyg_hgt, to_pyg_rgcn_state

        _pyg()
        self.model = model
        if model == "rgcn":
            convs = [to_pyg_rgcn_state(l.graph, {k: v.detach() for k, v in l.state_dict().items()}, l.in_dim,
                                       l.out_dim) for l in layers]
        else:
            convs = [to_pyg_hgt(l) for l in layers]
        super().__init__(convs, head, seed_type)
        self._graphs: list[Any] = []

    def prepare(self, mb: Any) -> None:
        import torch

        self._graphs = []
        for b in mb.blocks:
            if self.model == "rgcn":
                self._graphs.append((torch.stack([b.src, b.dst]), b.etype))
            else:  # per relation, the per-type ids (a destination's id is its source id)
                self._graphs.append({c: torch.stack([_local(b, c[0], b.src[lo:hi]), _local(b, c[2], b.dst[lo:hi])])
                                     for c, lo, hi in _relations(b)})

    def __call__(self, x: dict[str, Any], mb: Any) -> Any:
        import torch

        if self.model == "rgcn":
            h = mb.blocks[0].flatten_src(x)
            for i, (conv, b, (ei, et)) in enumerate(zip(self.layers, mb.blocks, self._graphs)):
                h = conv((h, h[:b.num_dst_nodes]), ei, et)
                if i == 0:  # this block's destinations are the next one's sources, in its own order
                    h = mb.blocks[1].flatten_src(b.split_dst(torch.relu(h)))
            out = mb.blocks[1].split_dst(h)
        else:
            h = x
            for i, (conv, b, ei) in enumerate(zip(self.layers, mb.blocks, self._graphs)):
                h = conv(h, ei)
                h = {t: h[t][:b.num_dst[t]] if t in h else x_empty(b, t, h) for t in b.ntypes}
                if i == 0:
                    h = {t: torch.relu(v) for t, v in h.items()}
            out = h
        return self.head(out[self.seed_type])


def x_empty(b: Any, t: str, h: dict[str, Any]) -> Any:
    import torch

    ref = next(iter(h.values()))
    return torch.zeros(b.num_dst[t], ref.shape[1], dtype=ref.dtype)


class _Dgl(_Net):
    """DGL's ``RelGraphConv`` (norm 1/|N_r(i)| per edge: PyG's and rgtune's mean per relation) or its
    ``HGTConv`` on each block as DGL's homogeneous block (destinations first: the batch's own order)."""

    def __init__(self, model: str, layers: list[Any], head: Any, seed_type: str) -> None:
        from rgtune.bench.baselines import dgl_hgt_conv, dgl_rgcn_conv

        self.model = model
        convs = [(dgl_rgcn_conv if model == "rgcn" else dgl_hgt_conv)(layer) for layer in layers]
        super().__init__(convs, head, seed_type)
        self._graphs: list[Any] = []

    def prepare(self, mb: Any) -> None:
        import dgl
        import torch

        self._graphs = []
        for b in mb.blocks:
            block = dgl.create_block((b.src, b.dst), num_src_nodes=b.num_nodes(), num_dst_nodes=b.num_dst_nodes)
            if self.model == "rgcn":
                key = b.dst * b.num_rels + b.etype
                count = torch.bincount(key, minlength=b.num_dst_nodes * b.num_rels)
                self._graphs.append((block, b.etype, (1.0 / count[key].float()).unsqueeze(1)))
            else:
                self._graphs.append((block, b.node_type, b.etype))

    def __call__(self, x: dict[str, Any], mb: Any) -> Any:
        import torch

        h = mb.blocks[0].flatten_src(x)
        for i, (conv, extra) in enumerate(zip(self.layers, self._graphs)):
            if self.model == "rgcn":
                block, etype, norm = extra
                h = conv(block, h, etype, norm)
            else:
                block, ntype, etype = extra
                h = conv(block, h, ntype, etype)
            if i == 0:  # this block's destinations are the next one's sources, in its own order
                h = mb.blocks[1].flatten_src(mb.blocks[0].split_dst(torch.relu(h)))
        return self.head(mb.blocks[1].split_dst(h)[self.seed_type])


def _relations(b: Any) -> Any:
    offsets = b.rel_offsets.tolist()
    return [(c, offsets[r], offsets[r + 1]) for r, c in enumerate(b.canonical_etypes)]


def _local(b: Any, ntype: str, global_ids: Any) -> Any:
    """Per-type ids of a block's global ids of one type (its destinations first, then its sources)."""
    t = b.ntypes.index(ntype)
    d = b.num_dst[ntype]
    dst_base = sum(b.num_dst[u] for u in b.ntypes[:t])
    src_base = b.num_dst_nodes + sum(b.num_src[u] - b.num_dst[u] for u in b.ntypes[:t])
    import torch

    return torch.where(global_ids < b.num_dst_nodes, global_ids - dst_base, global_ids - src_base + d)


if __name__ == "__main__":
    sys.exit(main())

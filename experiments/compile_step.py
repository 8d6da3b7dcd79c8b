"""A 2-layer model of rgtune layers, eager against ``torch.compile`` (BENCHMARKS.md, "torch.compile").

Per model: ``Embedding -> Layer -> ReLU -> Layer -> cross-entropy`` on the dataset's labelled nodes (the
default schedule, CPU backend, float32), one training step (forward and ``loss.backward()``, the
optimizer apart) timed eagerly and through ``torch.compile(model, fullgraph=True)`` (Inductor), in
interleaved rounds after a warm-up that includes the compile; the median step, the compile's time and the
number of graph breaks (``torch._dynamo.explain``); the two losses must agree.

    python experiments/compile_step.py --models rgcn,hgt,rgat --datasets aifb --threads 2 --rounds 20 \\
        --json experiments/results/compile_step.jsonl
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_jsonl, parser, setup, split_names  # noqa: E402 - experiments/ is not a package


def main() -> int:
    ap = parser(__doc__, "models", "datasets", "hidden", "backend", "data-dir", "threads", models="rgcn,hgt,rgat",
                datasets="aifb", hidden=16)
    ap.add_argument("--rounds", type=int, default=20, help="timed steps of each, interleaved (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps of each first (default 3)")
    ap.add_argument("--json", type=Path, default=None, help="append one JSON row per model and dataset")
    args = ap.parse_args()
    backend = setup(ap, args)
    import torch

    from rgtune.data import load_dataset
    from rgtune.runtime.module import Layer

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    for dataset in split_names(args.datasets):
        graph = load_dataset(dataset, root=args.data_dir)
        task = graph.task
        labelled = graph.to_global(task.category, task.train_idx)
        labels = task.train_labels.long()
        for model_name in split_names(args.models):
            torch.manual_seed(0)
            h = args.hidden

            class TwoLayers(torch.nn.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.embed = torch.nn.Embedding(graph.num_nodes(), h)
                    self.first = Layer(model_name, graph, h, h, backend=backend, mode="training")
                    self.second = Layer(model_name, graph, h, task.num_classes, backend=backend, mode="training")

                def forward(self) -> torch.Tensor:
                    out = self.second(torch.relu(self.first(self.embed.weight)))
                    return torch.nn.functional.cross_entropy(out[labelled], labels)

            model = TwoLayers()
            breaks = torch._dynamo.explain(model)().graph_break_count
            torch._dynamo.reset()
            compiled = torch.compile(model, fullgraph=True)
            t0 = time.perf_counter()
            compiled().backward()  # the compile
            compile_s = time.perf_counter() - t0
            times: dict[str, list[float]] = {"eager": [], "compiled": []}
            losses = {}
            for i in range(args.warmup + args.rounds):
                for name, fn in (("eager", model), ("compiled", compiled)):
                    model.zero_grad(set_to_none=True)
                    t0 = time.perf_counter()
                    loss = fn()
                    loss.backward()
                    if i >= args.warmup:
                        times[name].append((time.perf_counter() - t0) * 1e3)
                    losses[name] = loss.item()
            eager, comp = statistics.median(times["eager"]), statistics.median(times["compiled"])
            row = {"model": model_name, "dataset": graph.name, "hidden": h, "backend": backend,
                   "threads": args.threads, "graph_breaks": breaks, "compile_s": round(compile_s, 2),
                   "eager_ms": round(eager, 3), "compiled_ms": round(comp, 3), "speedup": round(eager / comp, 3),
                   "loss_diff": abs(losses["eager"] - losses["compiled"]), "rounds": args.rounds}
            print(row)
            if args.json:
                append_jsonl(args.json, row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

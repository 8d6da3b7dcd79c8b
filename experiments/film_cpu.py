"""FiLM on the CPU: rgtune's generated kernels (a few hand-picked schedules) against PyG's ``FiLMConv``.

For each dataset: the IR model :func:`rgtune.ir.models.film` (in = out = ``--hidden``), float32, its params
from :func:`rgtune.codegen.reference.init_params` and PyG's ``FiLMConv`` with the same weights
(:func:`rgtune.models.pyg.to_pyg_film`). Timed: the forward (rgtune's inference program; PyG under
``no_grad``) and one training step (rgtune's training program: forward, then the gradients of the input
and of every param; PyG: forward and ``backward``), each schedule's output checked against PyG first.
Warm-up, then ``--repeats`` interleaved rounds (the order rotates each round); the median of each, and
PyG's median over rgtune's (above 1: rgtune is faster). Threads: ``--threads`` for torch (PyG) and for the
generated kernels' OpenMP alike.

Example::

    python experiments/film_cpu.py --datasets aifb,mutag --threads 2 --repeats 9 --warmup 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch

#: hand-picked schedules (knobs not named stay at their defaults); training adds ``autodiff.save`` choices
SCHEDULES: dict[str, dict[str, Any]] = {
    "default": {},
    "dst pairs": {"compact.dst": "pair"},
    "src+dst pairs": {"compact.src": "pair", "compact.dst": "pair"},
    "pairs, blas": {"compact.src": "pair", "compact.dst": "pair", "gemm.impl": "blas"},
    "pairs, tiles 32x64": {"compact.src": "pair", "compact.dst": "pair", "gemm.tile_rows": 32},
}
TRAINING_EXTRA: dict[str, dict[str, Any]] = {
    "pairs, save nodes": {"compact.src": "pair", "compact.dst": "pair", "autodiff.save": "nodes"},
    "pairs, blas, wgrad blas": {"compact.src": "pair", "compact.dst": "pair", "gemm.impl": "blas",
                                "weightgrad.impl": "blas"},
}


def _median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def bench_dataset(name: str, hidden: int, repeats: int, warmup: int) -> list[dict[str, Any]]:
    from rgtune.codegen.cpu import CpuBackend
    from rgtune.codegen.reference import init_params
    from rgtune.codegen.training import train_step
    from rgtune.data import load_dataset
    from rgtune.ir.models import film
    from rgtune.models.pyg import to_pyg_film
    from rgtune.search_spaces import SearchSpace

    graph = load_dataset(name)
    backend = CpuBackend()
    program = film(hidden, hidden)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(graph.num_nodes(), hidden, generator=gen)
    dout = torch.randn(graph.num_nodes(), hidden, generator=gen)
    spaces = {mode: SearchSpace(program, graph, "cpu", mode=mode) for mode in ("inference", "training")}
    params = init_params(spaces["inference"].compile({}).kernels, graph, seed=1)
    conv = to_pyg_film(graph, params, hidden, hidden)
    edge_index, etype = torch.stack([graph.src, graph.dst]), graph.etype
    with torch.no_grad():
        expected = conv(x, edge_index, etype)

    def pyg_fwd() -> None:
        with torch.no_grad():
            conv(x, edge_index, etype)

    def pyg_step() -> None:
        conv.zero_grad(set_to_none=True)
        conv(x.detach().requires_grad_(), edge_index, etype).backward(dout)

    runs: dict[str, dict[str, Callable[[], Any]]] = {"fwd": {"pyg": pyg_fwd}, "train": {"pyg": pyg_step}}
    for label, cfg in SCHEDULES.items():
        point = spaces["inference"].compile(cfg)
        built = backend.build(point.kernels, graph, point.config)
        err = _rel(built.run(x, params), expected)
        assert err < 1e-4, (name, label, err)
        runs["fwd"][label] = lambda built=built: built.run(x, params)
    for label, cfg in {**SCHEDULES, **TRAINING_EXTRA}.items():
        point = spaces["training"].compile(cfg)
        kp = point.kernels
        built = backend.build(kp, graph, point.config)
        err = _rel(train_step(built, kp, graph, x, params, dout)[0], expected)
        assert err < 1e-4, (name, label, err)
        runs["train"][label] = lambda built=built, kp=kp: train_step(built, kp, graph, x, params, dout)

    rows = []
    for mode, fns in runs.items():
        times: dict[str, list[float]] = {k: [] for k in fns}
        for fn in fns.values():
            for _ in range(warmup):
                fn()
        names = list(fns)
        for r in range(repeats):
            for k in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                fns[k]()
                times[k].append(time.perf_counter() - t0)
        pyg = _median_ms(times["pyg"])
        for k in names:
            ms = _median_ms(times[k])
            rows.append({"dataset": name, "mode": mode, "impl": k, "ms": ms, "pyg_over_this": pyg / ms})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="aifb,mutag")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads {torch.get_num_threads()}, hidden {args.hidden}, median of {args.repeats}")
    print(f"{'dataset':8s} {'mode':6s} {'implementation':26s} {'ms':>9s} {'PyG / this':>10s}")
    for name in args.datasets.split(","):
        for row in bench_dataset(name, args.hidden, args.repeats, args.warmup):
            print(f"{row['dataset']:8s} {row['mode']:6s} {row['impl']:26s} {row['ms']:9.2f} "
                  f"{row['pyg_over_this']:10.2f}", flush=True)


if __name__ == "__main__":
    main()

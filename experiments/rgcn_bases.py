"""RGCN with basis decomposition on the CPU backend: ``reorder.bases=fold`` against ``transform``.

For each dataset and number of bases B: the forward (``built.run``) and one training step (``train_step``:
forward, backward to the input and every param, the derived weights' gradients sent back through their
folds) of ``rgcn(64, 64, num_bases=B)`` at the default schedule with ``reorder.bases`` = ``fold`` or
``transform`` and ``compact.src`` = ``edge`` or ``pair`` (and ``fold`` with ``reorder.aggregate_first=on``).
Every variant is built once and checked against the float64 reference; then the variants are timed
interleaved, one run each per round in a rotating order (a shared machine drifts), after warm-up rounds;
a row is the median over the rounds, in milliseconds.

    python experiments/rgcn_bases.py --datasets aifb,mutag --bases 2,8,30 --threads 2 --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rgtune.codegen.cpu import CpuBackend
from rgtune.codegen.reference import ReferenceExecutor, init_params
from rgtune.codegen.training import learnable_grads, train_step
from rgtune.data import load_dataset
from rgtune.ir.models import rgcn
from rgtune.search_spaces import SearchSpace

VARIANTS = {
    "fold": {"reorder.bases": "fold"},
    "fold+pair": {"reorder.bases": "fold", "compact.src": "pair"},
    "fold+aggregate_first": {"reorder.bases": "fold", "reorder.aggregate_first": "on"},
    "transform": {"reorder.bases": "transform"},
    "transform+pair": {"reorder.bases": "transform", "compact.src": "pair"},
}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).abs().max() / b.abs().max())


def bench(dataset: str, num_bases: int, hidden: int, rounds: int, warmup: int) -> list[str]:
    graph = load_dataset(dataset)
    backend = CpuBackend()
    program = rgcn(hidden, hidden, num_bases=num_bases)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(graph.num_nodes(), hidden, generator=gen)
    dout = torch.randn(graph.num_nodes(), hidden, generator=gen)
    runs = {}
    for mode in ("inference", "training"):
        space = SearchSpace(program, graph, "cpu", mode=mode)
        for name, knobs in VARIANTS.items():
            cfg = {**space.default(), **knobs}
            kp = space.compile(cfg).kernels
            params = init_params(kp, graph, seed=1)
            p64 = {k: v.double() for k, v in params.items()}
            built = backend.build(kp, graph, cfg)
            if mode == "inference":
                err = _relative(built.run(x, params), ReferenceExecutor(kp, graph).run(x.double(), p64))
                runs[(mode, name)] = (lambda b=built, p=params: b.run(x, p))
            else:
                out, dx, grads = train_step(built, kp, graph, x, params, dout)
                r_out, r_dx, r_grads = ReferenceExecutor(kp, graph).run_training(x.double(), p64, dout.double())
                r_grads = learnable_grads(kp, graph, p64, r_grads)
                err = max([_relative(out, r_out), _relative(dx, r_dx)] +
                          [_relative(grads[k], r_grads[k]) for k in r_grads])
                runs[(mode, name)] = (lambda b=built, k=kp, p=params: train_step(b, k, graph, x, p, dout))
            assert err < 1e-3, (dataset, num_bases, mode, name, err)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    keys = list(runs)
    for r in range(warmup + rounds):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            t = time.perf_counter()
            runs[key]()
            if r >= warmup:
                times[key].append(time.perf_counter() - t)
    rows = []
    for name in VARIANTS:
        fwd, step = (statistics.median(times[(m, name)]) * 1e3 for m in ("inference", "training"))
        rows.append(f"| {dataset} | {num_bases} | {name} | {fwd:.2f} | {step:.2f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="aifb,mutag")
    ap.add_argument("--bases", default="2,8,30")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"rgcn {args.hidden} -> {args.hidden}, cpu backend, {args.threads} threads, median of {args.rounds} "
          f"interleaved rounds (ms)")
    print("| dataset | bases | variant | forward | training step |")
    print("|---|---|---|---|---|")
    for dataset in args.datasets.split(","):
        for b in args.bases.split(","):
            for row in bench(dataset, int(b), args.hidden, args.rounds, args.warmup):
                print(row, flush=True)


if __name__ == "__main__":
    main()

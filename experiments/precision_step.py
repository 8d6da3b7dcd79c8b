"""A training step with the intermediates in float32, bfloat16 and float16 (BENCHMARKS.md, "Mixed precision").

Per model and dataset, one schedule (the default, or --config's knobs on top of it) is run as a layer (on
--backend: cpu, or cuda on a GPU) in training mode with ``precision.edges`` and ``precision.nodes`` (--classes) set to each storage type,
everything else equal: the step a user
calls, ``y = layer(x)`` then ``(y * g).sum().backward()`` (the optimizer apart), median of --repeats after
--warmup, each type in a process of its own so that its peak memory is its own: the resident-set growth
over the process's state once the graph, the input and the layer exist (the saved buffers, the workspace,
the gradients; on a GPU the allocator's peak over what is allocated before the first step). The output and the input's gradient are compared with the float32 run's on the same
weights (relative error, max |a - b| / max |b|).

    python experiments/precision_step.py --models rgcn,rgat,hgt --datasets "synthetic:am" --threads 2 \\
        --json experiments/results/precision/step.jsonl
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
from _common import append_jsonl, parser, setup, split_names  # noqa: E402 - experiments/ is not a package

TYPES = ("float32", "bfloat16", "float16")


def _one(args: Any, model: str, dataset: str, storage: str, out: Path) -> None:
    """In this process: the step of one storage type; its times, peak and results (saved for the comparison)."""
    import torch

    from rgtune.data import load_dataset
    from rgtune.runtime.module import Layer
    from rgtune.tuner.memory import reset_peak, status_bytes

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    graph = load_dataset(dataset, root=args.data_dir)
    heads = 1 if model == "rgcn" else args.heads
    config = {**json.loads(args.config or "{}"), **{f"precision.{c}": storage for c in split_names(args.classes)}}
    torch.manual_seed(0)
    backend = args.backend or "cpu"
    dev = "cuda" if backend == "cuda" else "cpu"
    layer = Layer(model, graph, args.hidden, args.hidden, heads, backend=backend, mode="training", config=config,
                  device=dev)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(graph.num_nodes(), args.hidden, generator=gen).to(dev).requires_grad_(True)
    g = torch.randn(graph.num_nodes(), args.hidden, generator=gen).to(dev)
    # peak memory: on a GPU torch's allocator's peak over what is allocated now, on the CPU the resident set's
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        reset_peak()
        base = status_bytes("VmRSS") or 0
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    times = []
    for i in range(args.warmup + args.repeats):
        x.grad = None
        layer.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        y = layer(x)
        (y * g).sum().backward()
        sync()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        if i < args.warmup + args.repeats - 1:
            del y
    peak = (torch.cuda.max_memory_allocated() if dev == "cuda" else status_bytes("VmHWM") or 0) - base
    torch.save({"y": y.detach().cpu(), "dx": x.grad.cpu()}, out)
    print(json.dumps({"median_ms": statistics.median(times), "times_ms": times, "peak_mb": peak / 2 ** 20,
                      "schedule": {k: v for k, v in layer.training_config.items() if k.split(".")[0] in
                                   ("precision", "autodiff", "compact", "fusion", "reorder", "layout")}}))


def main() -> int:
    ap = parser(__doc__, "models", "datasets", "hidden", "backend", "data-dir", "threads", models="rgcn,rgat,hgt",
                datasets="synthetic:am")
    ap.add_argument("--heads", type=int, default=1, help="heads of RGAT and HGT (default 1)")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    ap.add_argument("--types", default=",".join(TYPES), help="storage types (default all three)")
    ap.add_argument("--config", default=None, help="knobs as JSON on top of the default schedule")
    ap.add_argument("--classes", default="edges,nodes",
                    help="the buffer classes stored in the type: precision.edges, precision.nodes (default both)")
    ap.add_argument("--json", type=Path, default=None, help="append one JSON row per model and dataset")
    ap.add_argument("--one", nargs=4, metavar=("MODEL", "DATASET", "TYPE", "OUT"), help=argparse_hidden())
    args = ap.parse_args()
    setup(ap, args)
    if args.one:
        _one(args, *args.one[:3], Path(args.one[3]))
        return 0
    import torch

    for dataset in split_names(args.datasets):
        for model in split_names(args.models):
            row: dict[str, Any] = {"model": model, "dataset": dataset, "hidden": args.hidden, "threads": args.threads,
                                   "config": args.config, "classes": args.classes, "date": time.strftime("%Y-%m-%d"),
                                   "types": {}}
            results = {}
            for storage in split_names(args.types):
                out = Path(f"/tmp/rgtune_precision_{model}_{storage}.pt")
                cmd = [sys.executable, __file__, "--one", model, dataset, storage, str(out), "--hidden",
                       str(args.hidden), "--heads", str(args.heads), "--repeats", str(args.repeats), "--warmup",
                       str(args.warmup), *(["--backend", args.backend] if args.backend else []),
                       *(["--threads", str(args.threads)] if args.threads else []),
                       *(["--config", args.config] if args.config else []), "--classes", args.classes,
                       *(["--data-dir", args.data_dir] if args.data_dir else [])]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode:
                    row["types"][storage] = {"error": r.stderr.strip()[-1500:]}
                    print(f"{model} {dataset} {storage}: failed\n{r.stderr[-1500:]}", flush=True)
                    continue
                row["types"][storage] = json.loads(r.stdout.strip().splitlines()[-1])
                results[storage] = torch.load(out)
                out.unlink()
            if "float32" in results:
                ref = results["float32"]
                for storage, res in results.items():
                    row["types"][storage]["error"] = {
                        k: float((res[k] - ref[k]).abs().max() / ref[k].abs().max()) for k in ("y", "dx")}
            f32 = row["types"].get("float32", {})
            for storage, t in row["types"].items():
                if "median_ms" in t and "median_ms" in f32:
                    t["speedup"] = f32["median_ms"] / t["median_ms"]
                    t["memory_ratio"] = t["peak_mb"] / f32["peak_mb"]
                    print(f"{model} {dataset} {storage}: {t['median_ms']:.0f} ms ({t['speedup']:.2f}x), "
                          f"peak {t['peak_mb']:.0f} MB ({t['memory_ratio']:.2f}x), error {t.get('error')}", flush=True)
            if args.json:
                append_jsonl(args.json, row)
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    raise SystemExit(main())

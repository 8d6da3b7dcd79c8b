"""``rgtune show``: the IR before and after passes, the kernels and their counts for one configuration."""

from __future__ import annotations

import argparse
from typing import Any

from rgtune.cli._common import (EXIT_FAILURE, CLIError, add_peak_arg, add_workload_args, layer_sizes, load_graph,
                                model_options, parse_sets)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("show", help="the IR before/after passes, the kernels and their counts for one configuration",
                       description="Show what rgtune compiles for one configuration of the knobs.",
                       epilog="Example: rgtune show --model rgat --dataset aifb --set compact.src=pair "
                              "--set fusion.softmax=full --source")
    add_workload_args(p)
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                   help="set a knob (repeatable), e.g. --set compact.src=pair; `--space` lists them")
    p.add_argument("--backend", default="cpu", choices=("cpu", "cuda"), help="whose schedule knobs apply (default cpu)")
    p.add_argument("--source", action="store_true", help="also print the generated kernel source")
    p.add_argument("--space", action="store_true", help="also list every knob with its choices")
    add_peak_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rgtune.codegen.base import backend_target, create
    from rgtune.ir.counts import count, program_flops
    from rgtune.ir.registry import build_model, model_spec

    from rgtune.search_spaces import SearchSpace

    options = model_options(args)
    graph = load_graph(args)
    try:
        program = build_model(args.model, *layer_sizes(args), args.heads, options)
    except ValueError as e:  # the model's builder refuses these sizes or options
        raise CLIError(str(e)) from None
    target = backend_target(args.backend, trust_code=True)  # the user named it
    space = SearchSpace(program, graph, target)
    config = {**space.default(), **space.resolve(parse_sets(args.set))}
    point = space.compile(config)
    spec = model_spec(args.model)
    named = f"{args.model}({options})" if options else args.model
    in_dim, out_dim = layer_sizes(args)
    print(f"# workload: {named} on {graph!r}, in_dim={in_dim}, out_dim={out_dim}, heads={args.heads}, target={target}")
    print(f"# model options: {', '.join(o.describe() for o in spec.options) or 'none'}\n")
    print("# program before passes")
    print(program, end="\n\n")
    print("# configuration")
    for k in space.knobs:
        mark = "" if config[k.name] == k.default else "   (set)"
        print(f"  {k.name} = {config[k.name]}{mark}")
    if point.problems:
        print("\n# this configuration is invalid:")
        for p in point.problems:
            print(f"  - {p}")
        return EXIT_FAILURE
    print("\n# program after passes")
    print(point.compiled.program, end="\n\n")  # type: ignore[union-attr]
    print(f"# lowering plan\n  {point.compiled.plan}", end="\n\n")  # type: ignore[union-attr]
    print("# kernels")
    print(point.kernels.describe(), end="\n\n")
    print(f"# the program as written: {program_flops(program, graph):,} FLOPs")
    counts = count(point.kernels, graph, config)
    _print_counts(counts)
    _print_floor(counts, create(args.backend).device_type, args.peak)
    if args.source:
        _print_sources(args.backend, point.kernels, config)
    if args.space:
        print("\n" + space.describe())
    return 0


def _print_counts(c: dict[str, Any]) -> None:
    print("# counts")
    print(f"  FLOPs           {c['flops']:,}")
    print(f"  bytes (minimum) {c['bytes_min']:,}")
    print(f"  bytes (gathered){c['bytes_gathered']:>14,}")
    print(f"  kernels         {c['kernels']}")
    if c["weight_folds"]:
        print(f"  weight folds    {c['weight_folds']} ({c['weight_flops']:,} of the FLOPs, every call)")
    if c["index_probes"]:
        print(f"  pair lookups    {c['index_probes']:,} binary-search reads (compact.pair_index=bsearch)")
    print(f"  atomic updates  {c['atomics']:,}")
    print(f"  GEMM rows       {c['gemm_rows']}")
    print(f"  GEMM tiles      {c['gemm_tiles']:,} ({c['gemm_rows_computed']:,} rows computed, short tiles padded)")


def _print_floor(counts: dict[str, Any], device_type: str, peak_name: str) -> None:
    """The schedule's floor on the backend's device (or ``--peak``'s): what its counts would take at the peak."""
    from rgtune.ir.roofline import device_peak, floor_ms, floor_terms

    peak, note = device_peak(device_type, peak_name)
    ms, bound = floor_ms(counts, peak)
    memory, compute = floor_terms(counts, peak)
    print("# floor: the fastest these counts could run, max(bytes (minimum) / bandwidth, FLOPs / FLOP rate); "
          "a measured time reaches floor / time of it")
    print(f"  floor           {ms:.3g} ms, {bound}-bound (bytes {memory:.3g} ms, FLOPs {compute:.3g} ms)")
    print(f"  peak            {peak.describe()}")
    if note:
        print(f"  note            {note}")


def _print_sources(backend_name: str, kp: Any, config: dict[str, Any]) -> None:
    """Every generated file of the kernels: a backend's ``generate`` returns a program whose
    ``sources`` maps file name to text (what a built program keeps; needs no GPU for cuda)."""
    from rgtune.codegen.base import create

    backend = create(backend_name)
    if not backend.generates_sources:
        raise CLIError(f"backend {backend_name!r} cannot show generated sources")
    for name, text in backend.generate(kp, config).sources.items():
        print(f"\n# generated: {name}\n{text}")

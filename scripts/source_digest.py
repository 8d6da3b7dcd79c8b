"""The hash of every generated source, per model, mode, target and schedule: a refactoring's check.

A change that moves code between the IR, the passes, lowering and the code generators must leave
what they generate unchanged. This script generates (no compiler, no GPU) the C and CUDA sources of
every IR configuration of every built-in model (and model options that change the program), in
inference and training, plus a fixed set of random schedules per (model, mode, target), and writes
one line per schedule: its key and the sha256 of its sources. Run it before and after, then diff.

    scripts/run python scripts/source_digest.py > before.txt      # on the old commit
    scripts/run python scripts/source_digest.py > after.txt       # on the new one
    diff before.txt after.txt && echo byte-identical

``--random N`` random schedules per (model, mode, target) (default 20, seeded); the last line is
the digest of all lines.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys

#: model (with options that change its program) -> (in_dim, out_dim, heads)
MODELS = {("rgcn", ""): (8, 8, 1), ("rgcn", "num_bases=2"): (8, 8, 1), ("rgcn", "num_blocks=2"): (8, 8, 1),
          ("rgat", ""): (8, 8, 2), ("rgat", "softmax=relation"): (8, 8, 2), ("hgt", ""): (8, 8, 2),
          ("film", ""): (8, 8, 1)}
GRAPH = "synthetic:custom,nodes=300,edges=2000,ntypes=3,rels=5,seed=11"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random", type=int, default=20, help="random schedules per (model, mode, target)")
    args = ap.parse_args()
    from rgtune.codegen.base import create
    from rgtune.data import load_dataset
    from rgtune.ir.registry import build_model, list_models
    from rgtune.search_spaces import SearchSpace

    graph = load_dataset(GRAPH)
    backends = {"cpu": create("cpu"), "cuda": create("cuda")}
    total = hashlib.sha256()
    for (model, options), (i, o, h) in MODELS.items():
        if model not in list_models():
            continue
        for mode in ("inference", "training"):
            for target, backend in backends.items():
                space = SearchSpace(build_model(model, i, o, h, options), graph, target, mode=mode)
                rng = random.Random(f"{model}/{options}/{mode}/{target}")
                configs = list(space.ir_configs()) + [space.sample(rng) for _ in range(args.random)]
                for config in configs:
                    point = space.compile(config)
                    if not point.valid:
                        digest = "invalid: " + "; ".join(point.problems)
                    else:
                        sources = backend.generate(point.kernels, point.config).sources
                        digest = hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()[:16]
                    line = (f"{model}({options}) {mode} {target} "
                            f"{json.dumps(point.config, sort_keys=True, default=str)} {digest}")
                    total.update(line.encode())
                    print(line)
    print(f"all {total.hexdigest()[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A PyG script changed by its import line, side by side (BENCHMARKS.md, "PyG scripts by an import line").

Runs ``docs/examples/pyg_rgcn_aifb.py`` (``--example rgcn``: AIFB entity classification, two ``RGCNConv``
layers, Adam, full-graph epochs) or ``docs/examples/pyg_hgt_aifb.py`` (``--example hgt``: two ``HGTConv``
layers on AIFB's ``HeteroData``) with PyG's conv and with ``rgtune.nn.pyg``'s, or
``docs/examples/dgl_rgcn_aifb.py`` (``--example dgl-rgcn``: DGL's ``RelGraphConv``, with ``rgtune.nn.dgl``'s) or
``docs/examples/dgl_hgt_aifb.py`` (``--example dgl-hgt``: DGL's ``HGTConv`` on AIFB made homogeneous) or
``docs/examples/dgl_gat_aifb.py`` (``--example dgl-gat``: DGL's ``HeteroGraphConv`` of a ``GATConv`` per relation),
each in a process of its own, from the same initial weights, ``--rounds`` times alternating; reports the median epoch time after
``--warmup`` epochs (rgtune's first epoch compiles its kernels), the peak memory, and how far apart the
two loss curves are (largest relative difference of any epoch's loss).

    python experiments/dropin_pyg.py --epochs 50 --threads 2 --rounds 3 --json experiments/results/dropin_pyg.jsonl
    python experiments/dropin_pyg.py --example hgt --epochs 10 --warmup 2 --threads 2 --rounds 2 \
        --json experiments/results/dropin_pyg.jsonl
    python experiments/dropin_pyg.py --example dgl-rgcn --epochs 50 --threads 2 --rounds 3 \
        --json experiments/results/dropin_pyg.jsonl
    python experiments/dropin_pyg.py --example dgl-hgt --epochs 50 --threads 2 --rounds 3 \
        --json experiments/results/dropin_pyg.jsonl
    python experiments/dropin_pyg.py --example dgl-gat --epochs 50 --threads 2 --rounds 3 \
        --json experiments/results/dropin_pyg.jsonl
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_jsonl, parser  # noqa: E402 - experiments/ is not a package

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
SCRIPTS = {"rgcn": EXAMPLES / "pyg_rgcn_aifb.py", "hgt": EXAMPLES / "pyg_hgt_aifb.py",
           "dgl-rgcn": EXAMPLES / "dgl_rgcn_aifb.py", "dgl-hgt": EXAMPLES / "dgl_hgt_aifb.py",
           "dgl-gat": EXAMPLES / "dgl_gat_aifb.py"}
#: the library each example's other import is
LIBRARY = {"rgcn": "pyg", "hgt": "pyg", "dgl-rgcn": "dgl", "dgl-hgt": "dgl", "dgl-gat": "dgl"}


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--example", choices=sorted(SCRIPTS), default="rgcn")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None, help="append the result (JSON lines)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rgtune-dropin-"))
    lib = LIBRARY[args.example]
    runs: dict[str, list[dict]] = {lib: [], "rgtune": []}
    for rnd in range(args.rounds):
        for impl in (lib, "rgtune") if rnd % 2 == 0 else ("rgtune", lib):
            out = work / f"{impl}{rnd}.json"
            cmd = [sys.executable, str(SCRIPTS[args.example]), "--impl", impl, "--epochs", str(args.epochs), "--threads",
                   str(args.threads), "--init", str(work / "init.pt"), "--json", str(out)]
            subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=work)
            runs[impl].append(json.loads(out.read_text()))
    epoch_ms = {impl: statistics.median(t * 1e3 for r in rs for t in r["epoch_s"][args.warmup:]) for impl, rs in runs.items()}
    peak = {impl: max(r["peak_mb"] for r in rs) for impl, rs in runs.items()}
    ref, ours = runs[lib][0]["losses"], runs["rgtune"][0]["losses"]
    apart = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(ref, ours))
    row = {"example": args.example, "epochs": args.epochs, "threads": args.threads, "rounds": args.rounds, "epoch_ms": epoch_ms,
           "peak_mb": peak, "speedup": epoch_ms[lib] / epoch_ms["rgtune"], "losses_max_rel_diff": apart,
           "test_acc": {impl: rs[0]["test_acc"] for impl, rs in runs.items()}}
    print(f"epoch: {lib} {epoch_ms[lib]:.1f} ms, rgtune {epoch_ms['rgtune']:.1f} ms ({row['speedup']:.1f}x); peak "
          f"{lib} {peak[lib]:.0f} MB, rgtune {peak['rgtune']:.0f} MB; loss curves apart by {apart:.2g} (relative, "
          f"largest of {args.epochs} epochs); test accuracy {row['test_acc']}")
    if args.json:
        append_jsonl(Path(args.json), row)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""rgtune against the faster of PyG and DGL, from `rgtune bench --json` lines: time, peak memory, geometric means.

Per workload (model with options, dataset, sizes, threads) the latest line (of --date), per mode (fwd: the
forward; fwd+bwd: a training step): each implementation's median ms (or what stopped it: OOM, "> N s"),
rgtune's speedup over the faster library, peak MB, rgtune's peak over the smaller library's; then geometric
means over the rows where a library finished. BENCHMARKS.md's tables (its `rgtune bench` commands made the lines):

    python experiments/bench_tables.py experiments/results/scale/bench.jsonl   # Real-size graphs, side by side
    python experiments/bench_tables.py experiments/results/cpu_bench.jsonl --date 2026-11-26   # Training step, CPU
    python experiments/bench_tables.py experiments/results/model_options_bench.jsonl   # Models with options
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, read_jsonl  # noqa: E402 - experiments/ is not a package

LIBRARIES = ("pyg", "dgl")
MODES = ("fwd", "fwd+bwd")


def _cell(impl: dict[str, Any], mode: str, limit_s: float | None) -> str:
    """The median ms, else why there is none."""
    if (ms := (impl.get("median_ms") or {}).get(mode)) is not None:
        return f"{ms:.3g}"
    return {"oom": "OOM", "timeout": f"> {limit_s:g} s" if limit_s else "> limit",
            "failed": "failed"}.get(impl.get("status") or "", "–")


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The Markdown table and the geometric means of ``rows`` (``rgtune bench --json`` lines)."""
    latest = {(r["model"], r.get("options") or "", r["dataset"], r["in_dim"], r["out_dim"], r["heads"],
               r["threads"]): r for r in rows}  # a re-run replaces a workload's row, in its first place
    out = ["| model | dataset | mode | rgtune ms | PyG ms | DGL ms | speedup over the faster | peak MB: rgtune / "
           "PyG / DGL | memory vs the smaller |", "|---|---|---|---|---|---|---|---|---|"]
    speed: dict[str, list[float]] = {m: [] for m in MODES}
    memory: dict[str, list[float]] = {m: [] for m in MODES}
    for r in latest.values():
        named = f"{r['model']}({r['options']})" if r.get("options") else r["model"]
        impls = {k: r["impls"].get(k, {}) for k in ("rgtune", *LIBRARIES)}
        for mode in MODES:
            ms = {k: (i.get("median_ms") or {}).get(mode) for k, i in impls.items()}
            peak = {k: (i.get("peak_mb") or {}).get(mode) for k, i in impls.items()}
            libs = {k: ms[k] for k in LIBRARIES if ms[k] is not None}
            faster = min(libs, key=libs.__getitem__) if libs else None
            cell = "–"
            if ms["rgtune"] and faster:
                speed[mode].append(libs[faster] / ms["rgtune"])
                cell = f"{speed[mode][-1]:.1f}x ({faster})"
            lib_peaks = [peak[k] for k in LIBRARIES if peak[k]]
            ratio = "–"
            if peak["rgtune"] and lib_peaks:
                memory[mode].append(peak["rgtune"] / min(lib_peaks))
                ratio = f"{memory[mode][-1]:.2f}x"
            cells = " | ".join(_cell(i, mode, r.get("impl_timeout_s")) for i in impls.values())
            peaks = " / ".join("–" if v is None else f"{v:.0f}" for v in peak.values())
            out.append(f"| {named} | {r['dataset']} | {mode} | {cells} | {cell} | {peaks} | {ratio} |")
    out.append("")
    for mode in MODES:
        if xs := speed[mode]:
            out.append(f"- {mode}: geomean {statistics.geometric_mean(xs):.1f}x over the faster library "
                       f"({len(xs)} rows, lowest {min(xs):.1f}x)")
        if xs := memory[mode]:
            out.append(f"- {mode} peak memory, rgtune / the smaller library's: geomean "
                       f"{statistics.geometric_mean(xs):.2f} ({len(xs)} rows, {min(xs):.2f}-{max(xs):.2f}; at most "
                       f"0.5 on {sum(x <= 0.5 for x in xs)})")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("jsonl", type=Path, help="JSON lines of `rgtune bench --json`")
    p.add_argument("--date", default=None, help="only the lines of this date (YYYY-MM-DD)")
    args = p.parse_args(argv)
    rows = [r for r in read_jsonl(args.jsonl) if args.date in (None, r.get("date"))]
    if not rows:
        print(f"bench_tables: no lines{f' of {args.date}' if args.date else ''} in {args.jsonl}", file=sys.stderr)
        return 1
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The cost model's frozen history: run the trial studies it is made of into one database.

`collect` runs, one after another, the `rgtune tune` studies of the plan below into --db (cost model off, no
confirmation; a study that already has its trials is resumed to its count, not repeated, so an interrupted
collection goes on where it stopped). `rgtune costmodel --freeze` then writes the database's `ok` trials to the
compact file the test command reads (tests/data/costmodel_history.json.gz, `rgtune.costmodel.frozen`), and
`rgtune costmodel --eval --history FILE --holdout D` ranks a held-out graph on it, with the same numbers on
every machine.

The plan: every model in both modes on the real graphs (random schedules: a held-out graph's schedules should
cover its space, not only the region a search found) and on four small synthetic graphs (TPE); a BGS-sized
graph (random, inference and training) and an AM-sized one (random, inference): the big graphs are ranked by a
model trained on small graphs only (`--train-max-edges`), what the transfer goal asks. The committed history
was collected with `--threads 1` (the other core was used meanwhile), its AM studies in two runs of 10 trials
(seeds 43 and 53), and then AIFB's and MUTAG's schedules were measured twice more (`python
experiments/costmodel_transfer.py --db ... --models rgcn,rgat,hgt --repeat-real 2 --no-eval --threads 1`):
a schedule's time is the median of its measurements.

`collect --part batches` runs the sampler studies (`tune --batches`, training, random schedules: what a study
for mini-batch training measures, per batch) into their own database, frozen to
tests/data/costmodel_history_batches.json.gz: the test command ranks each graph's sampler workload with a
model trained on the whole-graph history and the other graphs' samplers (`rgtune costmodel --eval --batches`).

Examples::

    python experiments/frozen_history.py collect --db sqlite:///frozen.db --threads 1
    python experiments/frozen_history.py collect --part batches --db sqlite:///frozen_batches.db --threads 1
    python experiments/frozen_history.py collect --db sqlite:///frozen.db --threads 1 --only synthetic:bgs
    rgtune costmodel --db sqlite:///frozen.db --freeze tests/data/costmodel_history.json.gz
    rgtune costmodel --eval --history tests/data/costmodel_history.json.gz --holdout aifb
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser  # noqa: E402

MODELS = ("rgcn", "rgat", "hgt")
MODES = ("inference", "training")
SMALL_SYNTHETIC = ("synthetic:bgs,scale=0.1", "synthetic:am,scale=0.01", "synthetic:ogbn-mag,scale=0.003,reverse=1",
                   "synthetic:custom,nodes=20000,edges=100000,ntypes=4,rels=20,degree_skew=1.5")


@dataclass(frozen=True)
class Study:
    dataset: str
    model: str
    mode: str
    trials: int
    sampler: str
    batches: str = ""  # tune --batches: the study times its schedules on this sampler's batches

    def argv(self, db: str, threads: int, seed: int, hidden: int) -> list[str]:
        return ["rgtune", "tune", "--model", self.model, "--dataset", self.dataset, "--mode", self.mode,
                "--in-dim", str(hidden), "--out-dim", str(hidden), "--trials", str(self.trials),
                "--sampler", self.sampler, "--seed", str(seed), "--threads", str(threads), "--cost-model", "off",
                "--confirm", "0", "--db", db, "--quiet"] + (["--batches", self.batches] if self.batches else [])


def plan() -> list[Study]:
    """The studies, the held-out graphs' first (a collection cut short still evaluates)."""
    out = [Study(d, m, mode, 60, "random") for d in ("aifb", "mutag") for mode in MODES for m in MODELS]
    out += [Study(d, m, mode, 40, "tpe") for d in SMALL_SYNTHETIC[:2] for mode in MODES for m in MODELS]
    out += [Study("synthetic:bgs", m, "inference", 20, "random") for m in MODELS]
    out += [Study(d, m, mode, 40, "tpe") for d in SMALL_SYNTHETIC[2:] for mode in MODES for m in MODELS]
    out += [Study("synthetic:bgs", m, "training", 12, "random") for m in MODELS]
    out += [Study("synthetic:am", m, "inference", 20, "random") for m in MODELS]
    return out


#: the sampler studies (--part batches): a graph whose batches are all of it (AIFB's 140 training nodes fit one
#: batch), a mid-sized one, and two big ones whose batches are small pieces of them (what sampling is for)
BATCHES = (("aifb", "neighbor:fanout=10x10,batch_size=256"), ("mutag", "neighbor:fanout=10x10,batch_size=256"),
           ("synthetic:am", "neighbor:fanout=10x10,batch_size=256,batches=2"),
           ("synthetic:ogbn-mag,reverse=1", "neighbor:fanout=10x10,batch_size=256,batches=2"))


def batch_plan() -> list[Study]:
    """The sampler studies: every model's training step on each graph's batches, random schedules."""
    return [Study(d, m, "training", 25, "random", batches) for d, batches in BATCHES for m in MODELS]


def _have(db: str, s: Study, hidden: int) -> int:
    """How many trials the study already has (0 when it does not exist yet)."""
    from rgtune.data.sampler_spec import SamplerSpec
    from rgtune.db import TrialDatabase

    key = SamplerSpec.parse(s.batches).key if s.batches else ""
    with TrialDatabase(db) as tdb:
        found = [w for w in tdb.workloads(model=s.model, dataset=s.dataset, batches=key)
                 if w.mode == s.mode and w.in_dim == hidden and w.out_dim == hidden]
        return sum(len(tdb.history(w)) for w in found)


def collect(db: str, threads: int, seed: int, hidden: int, only: str | None, part: str = "whole") -> None:
    studies = [s for s in (batch_plan() if part == "batches" else plan()) if only is None or s.dataset == only]
    for i, s in enumerate(studies, 1):
        have = _have(db, s, hidden)
        left = s.trials - have
        if left <= 0:
            print(f"[{i}/{len(studies)}] {s.model} {s.mode} {s.dataset}: has {have} trials", flush=True)
            continue
        t0 = time.time()
        # a resumed study draws with another seed: the random sampler would redraw its first schedules
        argv = Study(s.dataset, s.model, s.mode, left, s.sampler, s.batches).argv(db, threads, seed + have, hidden)
        rc = subprocess.run(argv, stdout=subprocess.DEVNULL).returncode
        on = f"{s.dataset} [{s.batches}]" if s.batches else s.dataset
        print(f"[{i}/{len(studies)}] {s.model} {s.mode} {on}: {left} trials in {time.time() - t0:.0f} s"
              + ("" if rc == 0 else f" (exit {rc})"), flush=True)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("action", choices=("collect",))
    p.add_argument("--db", default="sqlite:///frozen_history.db", help="the trial database")
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads of the measured kernels (default 1)")
    p.add_argument("--seed", type=int, default=43)
    p.add_argument("--hidden", type=int, default=64, help="feature size, in = out (default 64)")
    p.add_argument("--only", default=None, help="only the studies of this dataset")
    p.add_argument("--part", default="whole", choices=("whole", "batches"),
                   help="whole: the whole-graph studies (default); batches: the sampler studies (tune --batches)")
    args = p.parse_args()
    collect(args.db, args.threads, args.seed, args.hidden, args.only, args.part)


if __name__ == "__main__":
    main()

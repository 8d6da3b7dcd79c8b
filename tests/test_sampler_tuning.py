"""Tuning for a sampler (``tune --batches``): the spec, trials verified and timed on fixed sampled batches,
the sampler in the workload's key, the comparison with the whole graph's best, ``load_tuned(batches=...)``."""

from __future__ import annotations

import warnings

import pytest
import torch

from rgtune.codegen.base import create
from rgtune.data import load_dataset
from rgtune.data.sampler_spec import SamplerSpec
from rgtune.db import TrialDatabase
from rgtune.ir.registry import build_model
from rgtune.runtime import load_tuned
from rgtune.runtime._lookup import TunedScheduleWarning, tune_command
from rgtune.tuner.batches import SampledBatches
from rgtune.tuner.measure import MeasureOptions, MeasureWorker
from rgtune.tuner.study import TuneOptions, Tuner
from rgtune.tuner.workload import Workload

GRAPH = "synthetic:custom,nodes=400,edges=3000,ntypes=2,rels=4,seed=2"
SAMPLER = "neighbor:fanout=5x4,batch_size=32,batches=2"
FAST = MeasureOptions(warmup=1, repeats=2, min_seconds=0.0, timeout=60.0)


# ------------------------------------------------------------------ the spec
def test_the_key_is_the_sampler_and_not_how_many_batches_are_timed():
    a = SamplerSpec.parse("neighbor:fanout=15x10,batch_size=1024,batches=8,seed=3")
    b = SamplerSpec.parse("neighbor: batch_size=1024, fanout=15x10")
    assert a.key == b.key == "neighbor:fanout=15x10,batch_size=1024"
    assert (a.batches, a.seed, b.batches, b.seed) == (8, 3, 4, 0)
    assert SamplerSpec.parse(str(a)) == a
    assert SamplerSpec.parse("neighbor:fanout=-1,batch_size=8,seed_type=paper").key == \
        "neighbor:fanout=-1,batch_size=8,seed_type=paper"


@pytest.mark.parametrize("text, says", [
    ("fanout=15x10,batch_size=4", "kind:field=value"),
    ("neighbor:fanout=15x10", "missing batch_size"),
    ("neighbor:fanout=15x0,batch_size=4", "fanout must be"),
    ("neighbor:fanout=15x10,batch_size=4,fan=3", "unknown field 'fan=3'"),
    ("neighbor:fanout=ax10,batch_size=4", "integers"),
    ("neighbor:fanout=15,batch_size=0", "batch_size must be at least 1"),
    ("neighbor:fanout=15,batch_size=4,batch_size=5", "given twice"),
])
def test_a_bad_sampler_is_refused_naming_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        SamplerSpec.parse(text)


def test_the_seeds_are_the_tasks_training_nodes_where_the_graph_has_a_task():
    g = load_dataset("aifb")
    spec = SamplerSpec.parse("neighbor:fanout=4,batch_size=16,batches=3")
    assert spec.seed_type(g) == g.task.category
    assert torch.equal(spec.seeds(g)[g.task.category], g.task.train_idx.long())
    mbs = spec.sample(g)
    assert len(mbs) == 3 and all({t for t, ids in mb.seeds.items() if ids.numel()} == {g.task.category} and
                                 mb.seeds[g.task.category].numel() == 16 for mb in mbs)
    assert [mb.seeds[g.task.category].tolist() for mb in mbs] == \
        [mb.seeds[g.task.category].tolist() for mb in spec.sample(g)]  # the same batches every time
    whole = SamplerSpec.parse("neighbor:fanout=4,batch_size=512,batches=3").sample(g)  # an epoch is one batch
    assert len(whole) == 3 and all(mb.seeds[g.task.category].numel() == g.task.train_idx.numel() for mb in whole)
    assert not torch.equal(whole[0].blocks[0].src, whole[1].blocks[0].src)  # other epochs: other draws
    with pytest.raises(ValueError, match="no node type 'paper'"):
        SamplerSpec.parse("neighbor:fanout=4,batch_size=16,seed_type=paper").seed_type(g)


# ------------------------------------------------------------------ trials on the batches
def _batches(model: str = "rgcn", mode: str = "training", backend: str = "reference") -> SampledBatches:
    g = load_dataset(GRAPH)
    heads = 2 if model == "hgt" else 1
    return SampledBatches(SamplerSpec.parse(SAMPLER), g, build_model(model, 8, 8, heads), create(backend), mode)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_the_batches_programs_pass_the_float64_reference_on_a_block(mode):
    sb = _batches(mode=mode)
    point = sb.point({})
    assert point.valid and point.full.compiled.plan.destinations
    built = sb.build(point)
    case = sb.verifier.case(0)
    assert tuple(case.expected["output"].value.shape) == (sb.checked.num_dst_nodes, 8)  # the destinations alone
    got = sb.run_case(built, case.on("cpu"))
    err, which, tol = sb.verifier.error(got, sb.case_of_variants(case))
    assert err < tol, which
    if mode == "training":  # both programs a layer runs are checked: the params'-gradients one too
        assert built.params_only is not None and built.params_only[0].input_grad is None
        assert any(name.endswith("(params' gradients program)") for name in sb.case_of_variants(case).expected)


@pytest.mark.parametrize("broken", ["full", "params_only"])
def test_a_wrong_gradient_of_either_program_is_a_wrong_result(broken):
    sb = _batches()
    built = sb.build(sb.point({}))
    program = built.checked[broken == "full"]
    backward = program.backward_fn

    def off(x, params, saved, dout):  # a parameter's gradient off by 1%: a kernel bug the check must catch
        dx, grads = backward(x, params, saved, dout)
        name = sorted(grads)[0]
        return dx, {**grads, name: grads[name] * 1.01}

    program.backward_fn = off
    case = sb.verifier.case(0)
    err, which, tol = sb.verifier.error(sb.run_case(built, case.on("cpu")), sb.case_of_variants(case))
    assert not err < tol
    assert which.endswith("(params' gradients program)") == (broken == "params_only")


def test_a_timed_run_binds_every_block_afresh_and_keeps_nothing_on_them():
    sb = _batches()
    built = sb.build(sb.point({}))
    bound = []
    for _, compiled in (built.full, built.params_only):
        bind = compiled.bind
        compiled.bind = lambda graph, bind=bind: bound.append(graph) or bind(graph)
    params = {k: v.float() for k, v in sb.verifier.inputs(0)[1].items()}
    run = sb.step(built, params)
    run()
    run()
    assert len(bound) == 2 * len(sb.blocks) and len({id(b) for b in bound}) == len(bound)  # a new copy each time
    assert all(not any(k.startswith("_rgtune") for k in vars(b)) for _, b in sb.blocks if b is not sb.checked)
    assert sum(first for first, _ in sb.blocks) == sb.num_batches == 2  # each batch's first layer: params only


def test_a_worker_measures_a_sampler_workload_on_the_cpu_backend():
    w = Workload("hgt", GRAPH, 8, 8, 2, "cpu", mode="training", batches=SAMPLER)
    with MeasureWorker(w, FAST) as worker:
        r = worker.measure({}, seed=0)
    assert r.status == "ok", r.error
    timed = r.details.build["timed_on"]
    assert timed["batches"] == 2 and timed["blocks"] == 4 and r.details.build["programs"] == 2


def test_paired_timing_is_refused_for_a_sampler_workload():
    w = Workload("rgcn", GRAPH, 8, 8, 1, "reference", batches=SAMPLER)
    with MeasureWorker(w, MeasureOptions(timing="paired")) as worker:
        with pytest.raises(Exception, match="timed plain"):
            worker.start()


# ------------------------------------------------------------------ the study, the key, the lookup
def test_a_sampler_study_is_its_own_workload_compared_with_the_whole_graphs_best(tmp_path):
    db = TrialDatabase(f"sqlite:///{tmp_path / 'results.db'}")
    opts = TuneOptions(trials=3, sampler="random", seed=0, progress=False, measure=FAST, confirm_top=2)
    whole = Tuner(Workload("rgcn", GRAPH, 8, 8, 1, "reference", mode="training"), db, opts).run()
    sampled = Tuner(Workload("rgcn", GRAPH, 8, 8, 1, "reference", mode="training", batches=SAMPLER), db, opts).run()
    assert sampled.workload_id != whole.workload_id
    records = {w.id: w for w in db.workloads()}
    assert records[sampled.workload_id].batches == SamplerSpec.parse(SAMPLER).key
    assert records[whole.workload_id].batches == ""
    # the whole graph's best was measured on the batches (second, after the default) and confirmed beside the best
    whole_best = db.best(records[whole.workload_id])
    cmp = sampled.whole_graph
    assert cmp is not None and cmp.trial_id == whole_best.id and cmp.whole_graph_ms == whole_best.median_ms
    assert cmp.confirmed and cmp.batches_ms is not None
    searched = [t for t in db.history(records[sampled.workload_id]) if t.confirmation_id is None]
    assert searched[1].schedule_hash == whole_best.schedule_hash or \
        searched[0].schedule_hash == whole_best.schedule_hash  # the default may be the whole graph's best
    g = load_dataset(GRAPH)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TunedScheduleWarning)  # both found on this device, for this graph
        for batches, trial in ((SAMPLER, sampled.best_trial_id), (None, whole.best_trial_id)):
            layer = load_tuned("rgcn", g, 8, 8, db=db, backend="reference", mode="training", batches=batches)
            assert layer.provenance["trial_id"] == trial
            assert layer.provenance["batches"] == ("" if batches is None else SamplerSpec.parse(SAMPLER).key)
    # another sampler: the whole graph's best, with a warning naming the command that tunes for it
    with pytest.warns(TunedScheduleWarning, match="tuned on the whole graph.*--batches"):
        layer = load_tuned("rgcn", g, 8, 8, db=db, backend="reference", mode="training",
                           batches="neighbor:fanout=3,batch_size=8")
    assert layer.provenance["trial_id"] == whole.best_trial_id


def test_the_tune_command_of_a_sampler_workload_names_it():
    assert tune_command("hgt", "aifb", 64, 64, 1, "cpu", None, "training", batches="neighbor:fanout=15x10,batch_size=1024") \
        == "tune --model hgt --dataset aifb --hidden 64 --backend cpu --mode training --batches " \
           "neighbor:fanout=15x10,batch_size=1024"


def test_the_cli_refuses_a_bad_sampler(tmp_path, capsys):
    from rgtune.cli import main

    base = ["tune", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8", "--backend", "reference",
            "--db", str(tmp_path / "r.db"), "--trials", "1"]
    assert main(base + ["--batches", "neighbor:fanout=3"]) == 2
    assert "--batches: sampler 'neighbor:fanout=3': missing batch_size" in capsys.readouterr().err

"""The learned cost model: features, training, the saved model, the pruning policy, holdout metrics, CLI."""

from __future__ import annotations

import inspect
import io
import math
import random
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from rgtune.data import load_dataset
from rgtune.data.sampler_spec import SamplerSpec
from rgtune.ir.counts import count
from rgtune.ir.models import build_model
from rgtune.ir.registry import list_models
from rgtune.search_spaces import SearchSpace
from rgtune.costmodel import features as _costmodel_features
from rgtune.costmodel import store as _costmodel_store
from rgtune.cli import main as cli_main
from rgtune.costmodel import (
    CostModel,
    CostModelGuide,
    GraphLoader,
    PrunePolicy,
    RankPolicy,
    Sample,
    WorkloadContext,
    evaluate_holdout,
    fit_on_history,
    kendall_tau,
    model_path_for,
    ordered_pair_accuracy,
    ranking_metrics,
    topk_error,
)
from rgtune.db import DeviceInfo, TrialDatabase
from rgtune.db.trial_result import TrialResult

GRAPHS = [f"synthetic:custom,nodes={n},edges={e},ntypes=2,rels={r},seed=1"
          for n, e, r in ((200, 1500, 3), (300, 2500, 5), (250, 4000, 4))]
DEVICE = DeviceInfo(name="test cpu", backend="cpu", compiler="cc 1")
OTHER_DEVICE = DeviceInfo(name="other cpu", backend="cpu", compiler="cc 2")
SIZES = (8, 8, 1)
LOADED = GraphLoader()  # shared: loading a graph and its layouts once keeps the tests fast

MODELS = list_models()


def small_hgb(seed: int) -> Any:
    """A quick regressor for tests (module level: a saved model pickles it by name)."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(max_iter=40, max_leaf_nodes=8, random_state=seed)


def _true_ms(space: SearchSpace, graph: Any, config: dict[str, Any]) -> float:
    """A made-up but structured device: moved bytes, atomics and launches cost time."""
    c = count(space.compile(config).kernels, graph, config)
    return 1e-3 + 2e-6 * c["bytes_gathered"] + 1e-5 * c["atomics"] + 5e-3 * c["kernels"] + 1e-8 * c["flops"]


_BY_NAME: dict[str, Any] = {}


def _graph(name: str) -> Any:
    if name not in _BY_NAME:
        _BY_NAME[name] = g = load_dataset(name)
        LOADED.add(g)
    return _BY_NAME[name]


def _fill(db: TrialDatabase, graph_name: str, trials: int, seed: int, device: DeviceInfo = DEVICE,
          model: str = "rgcn", backend: str = "cpu") -> Any:
    g = _graph(graph_name)
    space = SearchSpace(build_model(model, *SIZES), g, "cpu")
    w = db.ensure_workload(model, g, device, in_dim=SIZES[0], out_dim=SIZES[1], heads=SIZES[2], backend=backend)
    rng = random.Random(seed)
    configs = [space.default()] + [space.sample(rng) for _ in range(trials - 1)]
    for cfg in configs:
        t = db.start_trial(w, cfg)
        db.finish_trial(t, "ok", median_ms=_true_ms(space, g, cfg))
    return w


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> TrialDatabase:
    """Three graphs x 15 trials on one device, and a few trials on another device."""
    path = tmp_path_factory.mktemp("cm") / "results.db"
    db = TrialDatabase(f"sqlite:///{path}")
    for i, name in enumerate(GRAPHS):
        _fill(db, name, 15, seed=i)
    _fill(db, GRAPHS[0], 4, seed=9, device=OTHER_DEVICE)
    return db


def _ok(ms: float) -> TrialResult:
    """A measured trial of ``ms`` milliseconds, as the tuner hands it to the guide."""
    return TrialResult("ok", median=ms / 1e3)


def _device(db: TrialDatabase, device: DeviceInfo = DEVICE) -> str:
    return device.name  # the history of a device is found by its name


# ------------------------------------------------------------------ docs
@pytest.mark.parametrize("module", ["rgtune.costmodel", "rgtune.costmodel.model", "rgtune.costmodel.features",
                                    "rgtune.costmodel.metrics", "rgtune.costmodel.store", "rgtune.costmodel.history",
                                    "rgtune.costmodel.policies", "rgtune.tuner.measure"])
def test_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------ features
def test_features_are_deterministic_and_name_no_model_or_knob():
    g = _graph(GRAPHS[0])
    names_per_model = {}
    for model in sorted(MODELS):
        ctx = WorkloadContext.create(model, g, 8, 8, 2 if model not in ("rgcn", "film") else 1, backend="cpu", device="d")
        cfg = ctx.space.sample(random.Random(0))
        a, b = ctx.features(cfg), ctx.features(dict(reversed(list(cfg.items()))))
        assert a == b and all(k.startswith(("is:", "num:")) for k in a)
        assert all(math.isfinite(v) for v in a.values())
        # every knob of the space shows up by its own name: the features are derived, not listed
        assert {f"is:knob:{k.name}={cfg[k.name]}" for k in ctx.space.knobs} <= set(a)
        names_per_model[model] = a
    src = inspect.getsource(_costmodel_features).replace(_costmodel_features.__doc__ or "", "")  # code, not examples
    assert not any(m in src for m in MODELS), "the featurizer must not name a model"
    assert "gemm." not in src and "layout." not in src, "the featurizer must not name a knob"
    # the relative counts of the default schedule are 0 (the per-workload anchor)
    ctx = WorkloadContext.create("rgat", g, 8, 8, 1, backend="cpu", device="d")
    assert ctx.features(ctx.space.default())["num:rel_bytes_gathered"] == 0.0


def test_a_graph_that_is_not_loaded_gives_rows_without_counts():
    g = _graph(GRAPHS[0])
    full = WorkloadContext.create("rgcn", g, 8, 8, 1, backend="cpu", device="d")
    bare = WorkloadContext("rgcn", 8, 8, 1, "cpu", "d", dict(g.stats.as_dict()), None)
    row = bare.features(full.space.default())
    assert "num:log_flops" not in row and "num:log_flops" in full.features(full.space.default())
    assert row["num:graph:src_pair_ratio"] == g.stats.src_pair_ratio


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_a_sampler_workloads_row_counts_what_its_trials_time(mode):
    """A sampler workload's counts are those of the programs the tuner times on each of its blocks (destinations
    only; the params' gradients program on a first layer's block), per batch; its statistics are a block's."""
    from rgtune.codegen.base import create
    from rgtune.data.sampler_spec import SamplerSpec
    from rgtune.data.synthetic import random_graph
    from rgtune.tuner.batches import SampledBatches

    g = random_graph((60, 90), num_relations=3, num_edges=1200, seed=0)
    sampler = "neighbor:fanout=4x3,batch_size=16,batches=2"
    whole = WorkloadContext.create("rgat", g, 8, 8, 1, backend="cpu", device="d")
    ctx = WorkloadContext.create("rgat", g, 8, 8, 1, backend="cpu", device="d")
    ctx.mode = whole.mode = mode
    ctx.batches = sampler
    timed = SampledBatches(SamplerSpec.parse(sampler), g, build_model("rgat", 8, 8), create("cpu"), mode,
                           precision="any")  # as the history's spaces: 16-bit schedules too
    configs = [whole.space.default()] + [whole.space.sample(random.Random(i)) for i in range(3)]
    for config in configs:
        point = timed.point(config)
        full_config = {**whole.space.default(), **config}
        expected = {"flops": 0.0, "bytes_min": 0.0}
        for first, block in timed.blocks:
            kernels = (point.params_only if first and point.params_only is not None else point.full).kernels
            c = count(kernels, block, full_config)
            for k in expected:
                expected[k] += c[k] / timed.num_batches
        row = ctx.features(config)
        assert row["num:log_flops"] == pytest.approx(math.log1p(expected["flops"]))
        assert row["num:log_bytes_min"] == pytest.approx(math.log1p(expected["bytes_min"]))
        assert row["is:batches"] == 1.0 and "is:batches" not in whole.features(config)
        assert row["num:log_flops"] < whole.features(config)["num:log_flops"]  # a batch, not the graph
    largest = max((b for _, b in timed.blocks), key=lambda b: (b.num_edges(), b.num_nodes()))
    assert row["num:graph:log_num_edges"] == pytest.approx(math.log1p(largest.num_edges()))
    # the default's batch counts anchor the relative ones, as the whole graph's do for a whole-graph workload
    assert ctx.features(whole.space.default())["num:rel_flops"] == 0.0
    # another model's workload on the graph and sampler describes the same batches, drawn once
    other = WorkloadContext.create("rgcn", g, 8, 8, 1, backend="cpu", device="d")
    other.mode, other.batches = mode, sampler
    assert other.sampled is not None and ctx.sampled is not None
    assert [b for _, b in other.sampled.blocks] == [b for _, b in ctx.sampled.blocks]
    assert all(a is b for (_, a), (_, b) in zip(other.sampled.blocks, ctx.sampled.blocks))


def test_a_sampler_whose_batches_cannot_be_drawn_leaves_its_rows_without_counts(caplog):
    g = _graph(GRAPHS[0])
    ctx = WorkloadContext.create("rgcn", g, 8, 8, 1, backend="cpu", device="d")
    ctx.batches = "neighbor:fanout=3,batch_size=8,seed_type=no-such-type"
    with caplog.at_level("WARNING", logger="rgtune.costmodel"):
        rows = [ctx.features(ctx.space.default()) for _ in range(2)]
    assert all("num:log_flops" not in r and r["is:batches"] == 1.0 for r in rows)
    assert rows[0]["num:graph:src_pair_ratio"] == g.stats.src_pair_ratio  # the whole graph's statistics instead
    said = [r.getMessage() for r in caplog.records if "cannot draw the batches" in r.getMessage()]
    assert len(said) == 1 and "no-such-type" in said[0], said


def test_a_history_graph_that_cannot_be_loaded_is_reported_once(caplog):
    # its rows lose the counts, and the model ranks clearly worse: that must not pass silently
    loader = GraphLoader()
    with caplog.at_level("WARNING", logger="rgtune.costmodel"):
        assert loader("no-such-dataset", "0123") is None
        assert loader("no-such-dataset", "0123") is None
    warnings = [r for r in caplog.records if "cannot be loaded here" in r.getMessage()]
    assert len(warnings) == 1
    assert "'no-such-dataset'" in warnings[0].getMessage() and "--data-dir" in warnings[0].getMessage()


# ------------------------------------------------------------------ training / prediction
def _samples(db: TrialDatabase) -> list[Sample]:
    return fit_on_history(db, CostModel(min_trials=1), "cpu", _device(db), path=None, graphs=LOADED).samples


@pytest.mark.parametrize("estimator", ["hgb", "et", "pairwise"])
def test_training_on_other_graphs_ranks_a_new_one(history, estimator):
    fit = fit_on_history(history, CostModel(estimator), "cpu", _device(history), path=None, graphs=LOADED,
                         exclude=lambda w: w.dataset == GRAPHS[2])
    assert fit.model.ready and fit.model.n_trials == 30 and fit.model.n_workloads == 2
    mine = {f"w{w.id}" for w in history.workloads() if w.device == DEVICE.name}
    assert {s.workload for s in fit.samples} <= mine  # another device's times are not comparable
    r = evaluate_holdout(history, GRAPHS[2], cost_model=CostModel(estimator), graphs=LOADED)
    assert r.n_train == 30 and r.per_workload[0]["schedules"] >= 10
    assert r.metrics["opa"] > 0.75, r.metrics  # the made-up device is a function of the counts
    assert fit.model.log_scale > 0  # scores read as log time the right way round (a ranker's slope is fit)


def test_a_compiler_update_keeps_the_history_but_another_device_does_not(history, tmp_path):
    db = _copy(history, tmp_path)
    _fill(db, GRAPHS[1], 3, seed=5, device=DeviceInfo(name=DEVICE.name, backend="cpu", compiler="cc 1.1"))
    fit = fit_on_history(db, CostModel(small_hgb), "cpu", DEVICE.name, path=None, graphs=LOADED)
    assert len(fit.samples) == 3 * 15 + 3  # the 4 trials of "other cpu" are left out
    assert len({s.workload for s in fit.samples}) == 4  # the new stack is its own workload (own normalization)


def test_fit_is_deterministic_and_targets_are_per_workload(history):
    samples = _samples(history)
    a = CostModel(small_hgb).fit(samples).predict([s.features for s in samples[:5]])
    b = CostModel(small_hgb).fit(samples).predict([s.features for s in samples[:5]])
    assert a.tolist() == b.tolist()
    from rgtune.costmodel.model import normalized_targets

    y = normalized_targets(samples, "log_default")
    assert all(y[i] == 0.0 for i, s in enumerate(samples) if s.is_default)  # the anchor
    z = normalized_targets(samples, "rank")
    assert z.min() == 0.0 and z.max() <= 1.0  # percentiles (ties share the mean rank)
    first = [i for i, s in enumerate(samples) if s.workload == samples[0].workload]
    assert ordered_pair_accuracy(z[first], [samples[i].ms for i in first]) == 1.0


def test_current_weight_lets_the_tuned_workloads_own_trials_decide():
    # ten other workloads where a larger x is slower; the tuned one ("cur") is the other way round
    others = [Sample(f"w{w}", {"num:x": float(x)}, 1.0 + x) for w in range(10) for x in range(12)]
    own = [Sample("cur", {"num:x": float(x)}, 20.0 - x) for x in range(0, 12, 2)]
    probe = [{"num:x": 2.0}, {"num:x": 10.0}]  # schedules the tuned workload has measured

    def own_order_follows_own_trials(weight: float) -> bool:
        model = CostModel("et", current_weight=weight, min_trials=2).fit(others + own, current="cur")
        low_x, high_x = model.predict(probe)
        return bool(high_x < low_x)

    assert not own_order_follows_own_trials(1.0)  # one workload among eleven: the majority decides
    assert own_order_follows_own_trials(50.0)
    assert CostModel(current_weight=4).params()["current_weight"] == 4.0  # part of the saved model's key
    with pytest.raises(ValueError, match="current_weight must be a positive number"):
        CostModel(current_weight=0)


def test_too_little_history_keeps_the_model_out_of_the_way(history, tmp_path):
    small = TrialDatabase(f"sqlite:///{tmp_path / 'small.db'}")
    w = _fill(small, GRAPHS[0], 8, seed=0)
    fit = fit_on_history(small, CostModel(), "cpu", w.device, graphs=LOADED)
    assert not fit.model.ready and fit.model.status.startswith("cost model off")
    assert "8 ok trial(s) of 1 workload(s)" in fit.model.status
    pruner = CostModelGuide(CostModel(), PrunePolicy(explore=0.0, warmup=1), graphs=LOADED)
    status = pruner.bind(small, w, _graph(GRAPHS[0]))
    assert status.startswith("cost model off")
    space = SearchSpace(build_model("rgcn", *SIZES), _graph(GRAPHS[0]), "cpu")
    assert all(pruner(space.sample(random.Random(i)), None) == (False, None) for i in range(5))


# ------------------------------------------------------------------ the saved model
def test_a_saved_model_is_reused_and_a_corrupt_or_incompatible_one_is_retrained(history, tmp_path, monkeypatch):
    db = _copy(history, tmp_path)
    fp = _device(db)
    first = fit_on_history(db, CostModel(small_hgb), "cpu", fp, graphs=LOADED)
    saved = model_path_for(db, fp, "cpu")
    assert first.path == saved and saved.exists() and saved.parent.name == "copy.db.costmodel"
    again = fit_on_history(db, CostModel(small_hgb), "cpu", fp, graphs=LOADED)
    assert again.loaded and not again.refit  # same history: the saved regressor is used as it is
    rows = [s.features for s in first.samples[:4]]
    assert again.model.predict(rows).tolist() == first.model.predict(rows).tolist()

    data = bytearray(saved.read_bytes())
    data[-20:] = b"\x00" * 20  # a damaged payload
    saved.write_bytes(bytes(data))
    fixed = fit_on_history(db, CostModel(small_hgb), "cpu", fp, graphs=LOADED)
    assert not fixed.loaded and fixed.refit and "checksum" in fixed.note
    assert fit_on_history(db, CostModel(small_hgb), "cpu", fp, graphs=LOADED).loaded  # rewritten, trusted again

    saved.write_bytes(b"garbage\x00\xff")
    assert "corrupt header" in fit_on_history(db, CostModel(small_hgb), "cpu", fp, graphs=LOADED).note

    monkeypatch.setattr(_costmodel_store, "FORMAT_VERSION", _costmodel_store.FORMAT_VERSION + 1)
    newer = fit_on_history(db, CostModel(small_hgb), "cpu", fp, graphs=LOADED)
    assert not newer.loaded and "format" in newer.note and newer.model.ready
    # a model saved with other settings is not taken for this one
    assert "trained for" in fit_on_history(db, CostModel(small_hgb, "rank"), "cpu", fp, graphs=LOADED).note


# ------------------------------------------------------------------ the pruning policy
def _bound_pruner(history, policy: PrunePolicy) -> tuple[CostModelGuide, SearchSpace]:
    w = next(w for w in history.workloads() if w.dataset == GRAPHS[1] and w.device == DEVICE.name)
    g = _graph(GRAPHS[1])
    space = SearchSpace(build_model("rgcn", *SIZES), g, "cpu")
    pruner = CostModelGuide(CostModel(small_hgb), policy, model_path=None, graphs=LOADED)
    assert pruner.bind(history, w, g, space).startswith("cost model on")
    return pruner, space


def test_the_explore_fraction_is_measured_whatever_the_prediction(history):
    pruner, space = _bound_pruner(history, PrunePolicy(margin=1.0, explore=0.25, seed=7, max_skip=10_000))
    _everything_worse(pruner)
    rng = random.Random(0)
    configs = [space.sample(rng) for _ in range(30)] * 5  # the coin is per candidate, repeats or not
    decisions = []
    for _ in range(2):
        pruner._rng = random.Random(pruner.policy.seed)
        decisions.append([pruner(cfg, None) for cfg in configs])
    assert decisions[0] == decisions[1]  # seeded
    measured = sum(not prune for prune, _ in decisions[0]) / len(configs)
    assert 0.15 <= measured <= 0.35, measured  # 150 draws: 3 standard deviations
    assert pruner.counts["explored"] == sum(not p for p, _ in decisions[0] + decisions[1])
    assert all(ms is not None and ms > 0 for _, ms in decisions[0])


def _everything_worse(pruner: CostModelGuide) -> None:
    w = pruner._w
    w.scores[w.best] = -1e6  # the model now believes the best measured schedule is unbeatable


def test_only_clearly_worse_predictions_are_pruned(history):
    pruner, space = _bound_pruner(history, PrunePolicy(margin=1.3, explore=0.0, max_skip=10_000))
    w = pruner._w
    best_predicted = pruner._to_ms(w.scores[w.best])  # the rule compares prediction with prediction
    rng = random.Random(1)
    seen = {True: 0, False: 0}
    for _ in range(60):
        cfg = space.sample(rng)
        prune, ms = pruner(cfg, space.compile(cfg))
        ratio = ms / best_predicted
        if abs(ratio - 1.3) > 1e-9:
            assert prune == (ratio > 1.3), (ms, best_predicted)
        seen[prune] += 1
    assert seen[True] > 0 and seen[False] > 0


def test_warmup_max_skip_and_observe(history):
    pruner, space = _bound_pruner(history, PrunePolicy(margin=1.0, explore=0.0, max_skip=3, retrain_every=2))
    _everything_worse(pruner)
    rng = random.Random(2)
    out = [pruner(c, None)[0] for c in (space.sample(rng) for _ in range(8))]
    assert out == [True, True, True, False, True, True, True, False]  # never more than max_skip in a row
    before = pruner.counts["refits"]
    g = _graph(GRAPHS[1])
    for c in (space.sample(rng) for _ in range(4)):
        pruner.observe(c, space.compile(c), _ok(_true_ms(space, g, c)))
    pruner.observe(space.default(), None, TrialResult("wrong_result"))  # a failed trial teaches nothing
    assert pruner.counts["refits"] == before + 2 and pruner.counts["observed"] == 4
    desc = pruner.describe()
    assert desc["policy"]["margin"] == 1.0 and desc["model"]["estimator"] == "small_hgb"
    with pytest.raises(ValueError):
        PrunePolicy(explore=1.5)


def test_the_rank_policy_measures_the_best_predicted_candidate_not_measured_yet(history):
    from rgtune.db.records import canonical_knobs

    assert CostModelGuide(policy=RankPolicy()).pool_size() == 1  # not bound (no model): the sampler alone
    pruner, space = _bound_pruner(history, RankPolicy(pool=8, explore=0.0))
    assert pruner.pool_size() == 8
    rng = random.Random(4)
    pool = [(c, space.compile(c)) for c in (space.sample(rng) for _ in range(8))]
    fresh = [i for i, (c, _) in enumerate(pool) if canonical_knobs(c)[1] not in pruner._measured]
    assert len(fresh) >= 2
    pick, predicted = pruner.rank(pool)
    assert len(predicted) == 8 and all(ms is not None and ms > 0 for ms in predicted)
    assert pick == min(fresh, key=lambda i: predicted[i])
    pruner.observe(pool[pick][0], pool[pick][1], _ok(5.0))  # measured now: the next pool passes it over
    again, _ = pruner.rank(pool)
    assert again != pick and again in fresh
    # one candidate at a time (the enqueued default schedule) is measured, with its prediction
    prune, ms = pruner(space.default(), space.compile(space.default()))
    assert not prune and ms is not None
    explorer, _ = _bound_pruner(history, RankPolicy(pool=8, explore=1.0))
    assert explorer.rank(pool)[0] == fresh[0]  # exploring: the sampler's own first proposal
    desc = pruner.describe()
    assert desc["policy"]["pool"] == 8 and desc["counts"]["pools"] == 2 and desc["counts"]["not_picked"] == 14
    assert pruner.local_pool() == (4, 3)  # half the pool changes one of the 3 fastest measured schedules
    assert _bound_pruner(history, RankPolicy(pool=2, local=0.9))[0].local_pool() == (1, 3)  # the sampler keeps one
    assert CostModelGuide(policy=RankPolicy()).local_pool() == (0, 0)  # no pools (no model): nothing local
    local = [i == pick for i in range(8)]  # the loop marks the local candidates; their count and picks are kept
    pruner.rank(pool, local)
    assert pruner.counts["local"] == 1 and pruner.counts["local_picked"] == 0  # the fresh pick is another one
    for bad in ({"pool": 1}, {"explore": -0.1}, {"retrain_every": 0}, {"local": 1.0}, {"local": -0.5},
                {"parents": 0}):
        with pytest.raises(ValueError):
            RankPolicy(**bad)


def test_the_opening_is_the_models_fastest_predicted_fresh_schedules_no_two_alike(history):
    from rgtune.db.records import canonical_knobs

    assert CostModelGuide(policy=RankPolicy()).opening_pool() == 0  # no model: no opening
    assert CostModelGuide(policy=PrunePolicy()).opening([]) == []
    pruner, space = _bound_pruner(history, RankPolicy(pool=8, opening=3, opening_pool=40, opening_rule="top"))
    assert pruner.opening_pool() == 40
    rng = random.Random(5)
    configs = [space.sample(rng) for _ in range(12)]
    measured = next(c for c in configs if canonical_knobs(c)[1] not in pruner._measured)
    pruner.observe(measured, space.compile(measured), _ok(5.0))
    configs += [dict(configs[0]), space.default()]  # a duplicate, and the default schedule
    candidates = [(c, space.compile(c)) for c in configs]
    candidates = [(c, p) for c, p in candidates if p.valid]
    picks = pruner.opening(candidates)
    scores = pruner.model.predict([pruner._w.ctx.features(c, p.kernels) for c, p in candidates])
    hashes = [canonical_knobs(c)[1] for c, _ in candidates]
    excluded = pruner._measured | {canonical_knobs(space.default())[1]}
    first = sorted({h: i for i, h in reversed(list(enumerate(hashes))) if h not in excluded}.values())
    allowed = sorted(first, key=lambda i: scores[i])
    assert picks == allowed[:3] and len({hashes[i] for i in picks}) == 3
    assert pruner.describe()["counts"]["opening"] == 3
    assert _bound_pruner(history, RankPolicy(opening=0))[0].opening(candidates) == []
    for bad in ({"opening": -1}, {"opening": 8, "opening_pool": 4}):
        with pytest.raises(ValueError, match="opening"):
            RankPolicy(**bad)


def test_the_lcb_opening_ranks_by_the_optimistic_bound_of_models_fit_on_resampled_histories(history):
    import numpy as np

    from rgtune.db.records import canonical_knobs

    policy = RankPolicy(pool=8, opening=3, opening_pool=40, opening_rule="lcb", opening_members=4, seed=3)
    pruner, space = _bound_pruner(history, policy)
    rng = random.Random(5)
    candidates = [(c, space.compile(c)) for c in (space.sample(rng) for _ in range(12))]
    candidates = [(c, p) for c, p in candidates if p.valid]
    picks = pruner.opening(candidates)
    members = pruner.model.resampled(pruner._others + pruner._w.samples, 4, seed=3)
    rows = [pruner._w.ctx.features(c, p.kernels) for c, p in candidates]
    spread = np.array([m.predict(rows) for m in members])
    bound = spread.mean(axis=0) - spread.std(axis=0)
    excluded = pruner._measured | {canonical_knobs(space.default())[1]}
    hashes = [canonical_knobs(c)[1] for c, _ in candidates]
    first = sorted({h: i for i, h in reversed(list(enumerate(hashes))) if h not in excluded}.values())
    assert picks == sorted(first, key=lambda i: bound[i])[:3]
    assert pruner.counts["opening_members"] == 4 and pruner.counts["opening"] == 3
    assert spread.std(axis=0).max() > 0  # the members disagree somewhere: the bound is not the mean
    for bad in ({"opening_rule": "best"}, {"opening_members": 1}):
        with pytest.raises(ValueError, match="opening_"):
            RankPolicy(**bad)


def test_resampled_models_draw_whole_workloads_with_replacement():
    from rgtune.costmodel import Sample

    samples = [Sample(f"w{w}", {"num:x": float(x), "num:w": float(w)}, (1 + w) * (1 + x) ** (1 + w % 2))
               for w in range(4) for x in range(10)]
    members = CostModel(min_trials=1, seed=7).resampled(samples, 5, seed=2)
    assert [m.n_workloads for m in members] == [4] * 5  # a workload drawn twice counts as two
    assert {m.seed for m in members} == {8, 9, 10, 11, 12} and all(m.params()["target"] == "log_default"
                                                                   for m in members)
    again = CostModel(min_trials=1, seed=7).resampled(samples, 5, seed=2)
    rows = [s.features for s in samples[:10]]
    assert all((a.predict(rows) == b.predict(rows)).all() for a, b in zip(members, again))  # deterministic
    assert len({m.predict(rows).tobytes() for m in members}) > 1  # different draws, different models


def _copy(db: TrialDatabase, tmp_path: Path) -> TrialDatabase:
    import sqlite3

    path = tmp_path / "copy.db"
    src, dst = sqlite3.connect(db.engine.url.database), sqlite3.connect(path)
    with dst:
        src.backup(dst)  # WAL mode: a file copy could miss what is still in the -wal file
    src.close()
    dst.close()
    return TrialDatabase(f"sqlite:///{path}")


def test_a_fresh_workload_prunes_nothing_before_its_warmup(history, tmp_path):
    fresh_db = _copy(history, tmp_path)
    g = _graph(GRAPHS[2])
    # a new size on a known graph: a new workload without trials
    new = fresh_db.ensure_workload("rgcn", g, DEVICE, in_dim=16, out_dim=16, heads=1, backend="cpu")
    pruner = CostModelGuide(CostModel(small_hgb), PrunePolicy(margin=1.0, explore=0.0, warmup=2), model_path=None,
                             graphs=LOADED)
    assert pruner.bind(fresh_db, new, g).startswith("cost model on")
    space = SearchSpace(build_model("rgcn", 16, 16, 1), g, "cpu")
    assert pruner(space.default(), None) == (False, None)  # no measured trial: no ms yet
    pruner.observe(space.default(), None, _ok(5.0))
    prune, ms = pruner(space.sample(random.Random(3)), None)
    assert not prune and ms is not None  # one measured trial < warmup 2


# ------------------------------------------------------------------ in the tuning loop
def _history_of_this_device(workload: Any, url: str) -> TrialDatabase:
    """Two other graphs' trials recorded on the device ``workload``'s worker reports (the history must be this
    device's for the model to train on it)."""
    from rgtune.tuner.measure import MeasureWorker

    with MeasureWorker(workload) as worker:
        here = worker.start()
    db = TrialDatabase(url)
    for i, name in enumerate((GRAPHS[0], GRAPHS[2])):
        _fill(db, name, 16, seed=i, device=here, backend="reference")
    return db


def test_the_tuning_loop_drives_a_model_trained_on_other_graphs(tmp_path):
    from rgtune.tuner.measure import MeasureOptions
    from rgtune.tuner.workload import Workload
    from rgtune.tuner.study import TuneOptions, Tuner

    workload = Workload("rgcn", GRAPHS[1], *SIZES, "reference")
    db = _history_of_this_device(workload, f"sqlite:///{tmp_path / 'results.db'}")
    pruner = CostModelGuide(CostModel(small_hgb), PrunePolicy(margin=1.0, explore=0.0, warmup=2, max_skip=3),
                             model_path=None, graphs=LOADED)
    s = Tuner(workload, db, TuneOptions(trials=6, seed=0, progress=False, guide=pruner, confirm_top=0,
                                        measure=MeasureOptions(warmup=1, repeats=2, min_seconds=0.0))).run()
    assert s.guide is not None and s.guide["status"].startswith("cost model on"), s.guide
    counts = s.guide["counts"]
    assert s.measured == 6 and counts["observed"] == s.statuses["ok"] == 6, s.statuses
    assert counts["predicted"] == counts["candidates"] == s.trials_run and counts["pruned"] == s.statuses.get("pruned", 0)
    # every trial after the first measured one carries its prediction (ms need one measurement to anchor)
    rows = db.history(s.workload_id)
    assert rows[0].predicted_ms is None and all(r.predicted_ms is not None and r.predicted_ms > 0 for r in rows[1:])
    assert [r.status for r in rows[:2]] == ["ok", "ok"]  # warmup: the default schedule and one more are measured
    run = 0
    for r in rows:  # never more than max_skip prunes in a row
        run = run + 1 if r.status == "pruned" else 0
        assert run <= 3


def test_a_sampler_study_is_steered_by_a_model_of_whole_graphs_and_its_trials_are_learnt_as_batches(tmp_path):
    from rgtune.costmodel.history import load_samples
    from rgtune.tuner.measure import MeasureOptions
    from rgtune.tuner.study import TuneOptions, Tuner
    from rgtune.tuner.workload import Workload

    sampler = "neighbor:fanout=4x3,batch_size=16,batches=2"
    workload = Workload("rgcn", GRAPHS[1], *SIZES, "reference", mode="training", batches=sampler)
    db = _history_of_this_device(workload, f"sqlite:///{tmp_path / 'results.db'}")
    ranker = CostModelGuide(CostModel(small_hgb), RankPolicy(pool=4, explore=0.0, opening=2, seed=0),
                            model_path=None, graphs=LOADED)
    s = Tuner(workload, db, TuneOptions(trials=5, seed=0, progress=False, guide=ranker, confirm_top=0,
                                        measure=MeasureOptions(warmup=1, repeats=2, min_seconds=0.0))).run()
    assert s.guide is not None and s.guide["status"].startswith("cost model on"), s.guide
    assert s.guide["counts"]["opening"] == 2 and s.guide["counts"]["observed"] == s.statuses["ok"] == 5
    assert ranker._w is not None and ranker._w.ctx.batches == SamplerSpec.parse(sampler).key
    # the study's trials are history now: their rows describe the batches (counts of the mini-batch programs)
    (record,) = [w for w in db.workloads() if w.batches]
    rows = load_samples(db, [record], LOADED, {})
    assert len(rows) == 5 and all(r.features["is:batches"] == 1.0 and "num:log_flops" in r.features for r in rows)


def test_the_tuning_loop_ranks_pools_with_a_model_trained_on_other_graphs(tmp_path):
    from rgtune.tuner.measure import MeasureOptions
    from rgtune.tuner.workload import Workload
    from rgtune.tuner.study import TuneOptions, Tuner

    workload = Workload("rgcn", GRAPHS[1], *SIZES, "reference")
    db = _history_of_this_device(workload, f"sqlite:///{tmp_path / 'results.db'}")
    pruner = CostModelGuide(CostModel(small_hgb), RankPolicy(pool=6, explore=0.0, retrain_every=2, opening=2,
                                                              opening_pool=12), model_path=None, graphs=LOADED)
    s = Tuner(workload, db, TuneOptions(trials=6, seed=0, progress=False, guide=pruner, confirm_top=0,
                                        measure=MeasureOptions(warmup=1, repeats=2, min_seconds=0.0))).run()
    counts = s.guide["counts"]
    assert s.measured == s.trials_run == 6 and s.statuses == {"ok": 6}, s.statuses
    assert counts["opening"] == 2 and 2 <= counts["opening_pool"] <= 12, counts
    assert counts["pools"] == 3 and counts["refits"] == 3, counts
    # the default schedule and the opening one at a time, then 3 pools of up to 6 valid candidates, one measured
    # from each
    assert counts["candidates"] <= 3 + 3 * 6 and counts["not_picked"] == counts["candidates"] - 3 - 3, counts
    rows = db.history(s.workload_id)
    assert len(rows) == 6 and len({r.schedule_hash for r in rows}) == 6  # never re-measured, the opening neither
    assert all(r.predicted_ms is not None and r.predicted_ms > 0 for r in rows[1:])


def test_tune_cli_says_how_the_rank_policy_opened_a_new_study(tmp_path):
    from rgtune.cli import main
    from rgtune.tuner.workload import Workload

    url = f"sqlite:///{tmp_path / 'results.db'}"
    _history_of_this_device(Workload("rgcn", GRAPHS[1], *SIZES, "reference"), url).close()
    args = ["tune", "--model", "rgcn", "--dataset", GRAPHS[1], "--hidden", str(SIZES[0]), "--backend", "reference",
            "--db", url, "--trials", "6", "--seed", "0", "--quiet", "--confirm", "0"]
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(args + ["--cost-model-opening", "3"]) == 0
    assert re.search(r"cost model: cost model on: .*; opened with its 3 first picks of \d+ random schedules; "
                     r"picked 2 of \d+ proposed", buf.getvalue()), buf.getvalue()
    buf = io.StringIO()
    with redirect_stdout(buf):  # a resumed study does not open again
        assert main(args) == 0
    assert "opened" not in buf.getvalue() and "picked 6 of" in buf.getvalue(), buf.getvalue()


def test_tune_cli_cost_model_flags(tmp_path):
    from rgtune.cli import main

    url = f"sqlite:///{tmp_path / 'results.db'}"
    args = ["tune", "--model", "rgcn", "--dataset", GRAPHS[0], "--hidden", "8", "--backend", "reference",
            "--db", url, "--trials", "2", "--seed", "0", "--quiet"]
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(args) == 0
    out = buf.getvalue()
    # a fresh database: the model stays out of the way and says why (the default policy ranks pools)
    assert "measured trials" in out and re.search(r"cost model: cost model off: .*picked 0 of 0 proposed", out), out
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(args + ["--cost-model", "off"]) == 0
    assert "cost model:" not in buf.getvalue()
    assert main(args + ["--cost-model-policy", "prune", "--cost-model-margin", "0.5"]) == 2
    assert main(args + ["--cost-model-margin", "2"]) == 2  # a prune setting with the rank policy: an error
    assert main(args + ["--cost-model-policy", "prune", "--cost-model-opening-rule", "lcb"]) == 2
    from rgtune.costmodel.policies import OPENING_RULES
    from rgtune.cli import build_parser

    for rule in OPENING_RULES:  # the CLI spells the rules out; each of the pruner's must parse
        assert build_parser().parse_args(args + ["--cost-model-opening-rule", rule]).cost_model_opening_rule == rule
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(args + ["--cost-model-policy", "prune", "--cost-model-margin", "2"]) == 0
    assert re.search(r"cost model: cost model off: .*0 of \d+ candidates pruned", buf.getvalue()), buf.getvalue()
    assert main(args + ["--cost-model-policy", "rank", "--cost-model-pool", "1"]) == 2
    assert main(args + ["--cost-model-opening", "-1"]) == 2
    assert main(args + ["--cost-model-policy", "prune", "--cost-model-opening", "2"]) == 2
    with redirect_stdout(io.StringIO()):
        assert main(["costmodel", "--eval", "--db", url]) == 2  # the subcommand is reachable from `rgtune`


# ------------------------------------------------------------------ metrics and the command
def test_ranking_metrics_on_a_crafted_example():
    true = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert ordered_pair_accuracy(true, true) == 1.0 and kendall_tau(true, true) == pytest.approx(1.0)
    rev = true[::-1]
    assert ordered_pair_accuracy(rev, true) == 0.0 and kendall_tau(rev, true) == pytest.approx(-1.0)
    swapped = [2.0, 1.0, 3.0, 4.0, 5.0, 6.0]  # 1 of 15 pairs wrong
    assert ordered_pair_accuracy(swapped, true) == pytest.approx(14 / 15)
    assert kendall_tau(swapped, true) == pytest.approx(13 / 15)
    assert topk_error(swapped, true, 1) == pytest.approx(1.0)  # picks the 2.0 schedule: 100% slower
    assert topk_error(swapped, true, 5) == 0.0
    assert topk_error([6, 5, 4, 3, 2, 1], true, 5) == pytest.approx(1.0)  # top 5 miss the best (1.0): best of them 2.0
    assert ordered_pair_accuracy([1, 1, 1], [1, 2, 3]) == 0.5  # ties in the prediction: half right
    assert set(ranking_metrics(true, true)) == {"opa", "kendall_tau", "top1_error", "top5_error", "opa_10"}
    assert ordered_pair_accuracy(swapped, true, margin=0.1) == pytest.approx(14 / 15)  # 1.0 vs 2.0: counted ...
    assert ordered_pair_accuracy(swapped, [1.0, 1.05, 3, 4, 5, 6], margin=0.1) == 1.0  # ... 1.0 vs 1.05: a near tie


def test_costmodel_command_ends_with_the_metrics_line(history):
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli_main(["costmodel", "--eval", "--db", str(history.url), "--holdout", GRAPHS[0], "--backend", "cpu"])
    lines = buf.getvalue().strip().splitlines()
    assert rc == 0
    assert re.fullmatch(r"opa=\d\.\d{4} kendall_tau=-?\d\.\d{4} top1_error=\d+\.\d{4} top5_error=\d+\.\d{4} "
                        r"opa_10=(\d\.\d{4}|nan)",
                        lines[-1]), lines[-1]
    assert cli_main(["costmodel", "--eval", "--db", str(history.url)]) == 2  # --eval needs --holdout
    with redirect_stdout(io.StringIO()):
        assert cli_main(["costmodel", "--eval", "--db", str(history.url), "--holdout", "no-such-graph"]) == 1


def test_costmodel_command_freezes_a_history_and_evaluates_the_frozen_file_alike(history, tmp_path):
    """``--freeze`` writes the database's ok trials; ``--eval --history`` gives the database's metrics line."""
    frozen = tmp_path / "h.json.gz"
    with redirect_stdout(io.StringIO()) as out:
        assert cli_main(["costmodel", "--db", str(history.url), "--freeze", str(frozen)]) == 0
    assert out.getvalue().startswith(f"froze {history.count_trials(status='ok', batches='')} ok trials")
    lines = {}
    for source in (["--db", str(history.url)], ["--history", str(frozen)]):
        with redirect_stdout(io.StringIO()) as out:
            assert cli_main(["costmodel", "--eval", *source, "--holdout", GRAPHS[0], "--backend", "cpu"]) == 0
        lines[source[0]] = out.getvalue().strip().splitlines()[-1]
    assert lines["--db"] == lines["--history"]
    with redirect_stdout(io.StringIO()):
        assert cli_main(["costmodel", "--history", str(frozen)]) == 2  # a frozen history is evaluated, not trained
        assert cli_main(["costmodel", "--eval", "--history", str(tmp_path / "none.gz"), "--holdout", "aifb"]) == 2


def test_costmodel_command_does_not_create_a_database(tmp_path):
    missing = tmp_path / "missing.db"
    assert cli_main(["costmodel", "--eval", "--db", f"sqlite:///{missing}", "--holdout", "aifb"]) == 2  # as best's
    assert not missing.exists()


def test_costmodel_command_evaluates_a_samplers_workloads_and_names_one_it_has_not(capsys):
    frozen = str(Path(__file__).resolve().parent / "data" / "costmodel_history_batches.json.gz")
    assert cli_main(["costmodel", "--batches", "neighbor:fanout=10x10,batch_size=256"]) == 2
    assert "--batches is an option of --eval" in capsys.readouterr().err
    assert cli_main(["costmodel", "--eval", "--history", frozen, "--holdout", "aifb", "--batches",
                     "neighbor:batch_size=99,fanout=3"]) == 1
    assert "no trials on batches of neighbor:fanout=3,batch_size=99 from 'aifb'" in capsys.readouterr().err
    assert cli_main(["costmodel", "--eval", "--history", frozen, "--holdout", "aifb", "--batches", "fanout=3"]) == 1
    assert "kind:field=value" in capsys.readouterr().err


def test_the_costmodel_commands_choices_are_the_cost_models():
    from rgtune.cli.costmodel import ESTIMATOR_CHOICES, TARGET_CHOICES
    from rgtune.costmodel.model import ESTIMATORS, TARGETS

    assert sorted(ESTIMATOR_CHOICES) == sorted(ESTIMATORS) and TARGET_CHOICES == TARGETS


def test_curves_keep_one_timing_and_recheck_per_work_directory(load_experiment, tmp_path):
    import argparse
    import json

    curves = load_experiment("tuning_curves")
    run_dir = curves._run_dir(tmp_path, "hgt", "aifb", 0, "tpe")
    run_dir.mkdir(parents=True)
    # a run from before --timing and the tuner's recheck: plain, every trial measured once
    (run_dir / "trace.json").write_text(json.dumps({"trace": []}))
    for timing, recheck in (("paired", 1), ("plain", 3)):
        with pytest.raises(SystemExit, match=f"was run with --timing plain --recheck 1, not --timing {timing} "
                                             f"--recheck {recheck}: use another --workdir"):
            curves.run_one("hgt", "aifb", 0, "tpe", tmp_path / "base.db", tmp_path,
                           argparse.Namespace(timing=timing, recheck=recheck), "cpu")
    assert curves.run_one("hgt", "aifb", 0, "tpe", tmp_path / "base.db", tmp_path,
                          argparse.Namespace(timing="plain", recheck=1), "cpu") == {"trace": []}
    assert curves.build_parser().parse_args([]).recheck == 3  # the tuner's default
    cache = tmp_path / "retime.json"
    cache.write_text(json.dumps({"settings": {"rounds": 7, "hidden": 64, "backend": "cpu"}, "schedules": {"h": {}}}))
    plain = {"rounds": 7, "hidden": 64, "backend": "cpu", "timing": "plain"}
    assert curves._cached_retimes(cache, plain) == {"h": {}}
    assert curves._cached_retimes(cache, {**plain, "timing": "paired"}) == {}


def test_experiments_run_studies_side_by_side_only_on_a_gpu(load_experiment, tmp_path, capsys):
    """``--jobs``: studies side by side keep their timing apart only where the device's lock serializes
    it (GPU backends); on the CPU they would time each other's kernels, so it is refused up front."""
    import doctest

    curves = load_experiment("tuning_curves")
    parallel = sys.modules["_common"]  # by its own name, as the scripts import it: the job processes import it too
    assert doctest.testmod(parallel).failed == 0
    assert parallel.jobs_problem(1, "cpu") is None and parallel.jobs_problem(4, "cuda") is None
    assert "needs a GPU backend (cuda), not 'cpu'" in parallel.jobs_problem(2, "cpu")
    assert "--jobs must be >= 1" in parallel.jobs_problem(0, "cuda")
    seen: list[int] = []
    assert parallel.run_parallel(pow, [(2, 3), (3, 2), (2, 5)], jobs=2, on_done=seen.append) == [8, 9, 32]
    assert sorted(seen) == [8, 9, 32]
    assert parallel.threads_per_job(10 ** 6) == 1
    workdir = tmp_path / "work"
    with pytest.raises(SystemExit):
        curves.main(["--backend", "cpu", "--jobs", "2", "--history", f"sqlite:///{tmp_path / 'none.db'}",
                     "--workdir", str(workdir)])
    assert "--jobs 2 needs a GPU backend" in capsys.readouterr().err and not workdir.exists()
    transfer = load_experiment("costmodel_transfer")
    with pytest.raises(SystemExit):
        transfer.main(["--repeat-real", "2", "--no-eval", "--backend", "cpu", "--jobs", "3", "--db",
                       f"sqlite:///{tmp_path / 'h.db'}"])
    assert "--jobs 3 needs a GPU backend" in capsys.readouterr().err and not (tmp_path / "h.db").exists()

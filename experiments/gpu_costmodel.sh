#!/usr/bin/env bash
# The learned cost model's experiments on a lent GPU machine, in steps that fit its calls.
#
#   bash experiments/gpu_costmodel.sh STEP [STEP...]
#
# Steps (in this order; each writes its log and files under $OUT, default ./gpu_out):
#   setup    install the carried wheels (.whl/, from ../shared/tools/gpu-wheels) under /tmp/site; GPU facts
#   tests    the GPU tests (CUDA kernels against the float64 reference, 16-bit storage, the device's lock)
#   precision  the training step in float32, bfloat16 and float16 on AM- and ogbn-mag-sized graphs
#   collect  the GPU history: `tune` studies on the cuda backend side by side, then costmodel_transfer.py --repeat-real
#   curves   the tuning curves on the cuda backend (settings: CURVES_ARGS), runs side by side, re-timed
#   called   issue 44: short studies (objective: the layer as called) of every model and mode on AIFB and MUTAG,
#            then `rgtune bench` of each against PyG: the layer as called vs the tuner's record, the ratios
#   reuse    issue 44: RGAT's and HGT's training step as called with autodiff.reuse = inline | store | fuse
#            (experiments/edge_stores.py) on AIFB and MUTAG, hidden 16 and 64
#
# Datasets: .data/datasets/{aifb,mutag} (raw files) and .data/processed (processed graphs), carried.
# JOBS (default 8) studies run side by side: their verifying and timing take the GPU's lock in turn.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
JOBS=${JOBS:-8}
HISTORY=${HISTORY:-cm_history_gpu.db}
export PYTHONUNBUFFERED=1 RGTUNE_DATA_DIR=$PWD/.data/datasets RGTUNE_CACHE_DIR=$PWD/.data/processed
export PYTHONPATH=/tmp/site:$PWD

step_setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, cupy, optuna, sqlalchemy, sklearn, sys; print('python', sys.version.split()[0], 'torch', \
torch.__version__, 'cupy', cupy.__version__, 'optuna', optuna.__version__, 'sqlalchemy', sqlalchemy.__version__, \
'sklearn', sklearn.__version__); from rgtune.codegen.cuda.runtime import device_facts; print(device_facts())"
  nproc
}

step_tests() {
  python3 -m pytest -q -ra -p no:cacheprovider tests/test_cuda_gpu.py tests/test_device_lock.py 2>&1 | tail -30
  python3 -m pytest -q -ra -p no:cacheprovider -m gpu tests/test_models.py tests/test_cuda_training.py \
    tests/test_cuda_precision.py 2>&1 | tail -15
}

step_precision() {
  # issue 42 on a GPU: the training step with the intermediates in float32, bfloat16 and float16 (default schedules)
  python3 experiments/precision_step.py --backend cuda --models rgcn,rgat,hgt --datasets "synthetic:am;synthetic:ogbn-mag" \
    --repeats 10 --warmup 3 --json "$OUT/precision_step_gpu.jsonl"
}

step_collect() {
  # the CPU history's plan (BENCHMARKS.md): random search on the real graphs, TPE on four synthetic ones
  python3 -c "from rgtune.db import TrialDatabase as T; T('sqlite:///$HISTORY').close()"  # created once, up front
  for m in rgat hgt; do
    for d in aifb mutag; do echo "--model $m --dataset $d --sampler random --trials 60"; done
    for d in synthetic:bgs,scale=0.1 synthetic:am,scale=0.01 synthetic:ogbn-mag,scale=0.003,reverse=1 \
             synthetic:custom,nodes=20000,edges=100000,ntypes=4,rels=20,degree_skew=1.5; do
      echo "--model $m --dataset $d --trials 40"; done
  done | OMP_NUM_THREADS=$(( $(nproc) / JOBS > 0 ? $(nproc) / JOBS : 1 )) xargs -P "$JOBS" -L 1 \
    python3 -m rgtune.cli tune --backend cuda --cost-model off --confirm 0 --seed 23 --quiet --db "sqlite:///$HISTORY"
  python3 experiments/costmodel_transfer.py --repeat-real 2 --no-eval --backend cuda --jobs "$JOBS" \
    --db "sqlite:///$HISTORY"
  cp "$HISTORY" "$OUT/"
}

step_curves() {
  # CURVES_ARGS: the pre-registered settings (experiments/results/tuning_curves_gpu/PREREGISTRATION.md)
  # shellcheck disable=SC2086
  # CURVES_LIMIT: stop in time to pack the traces (the call's limit would kill the packing too)
  timeout "${CURVES_LIMIT:-540}" python3 experiments/tuning_curves.py --history "sqlite:///$HISTORY" --backend cuda \
    --jobs "$JOBS" --workdir curves_gpu --out "$OUT/curves" ${CURVES_ARGS:-}
  tar czf "$OUT/curves_gpu_traces.tgz" curves_gpu/runs/*/trace.json curves_gpu/retime 2>/dev/null
}

step_called() {
  # CALLED_BUDGET seconds per study (default 45), JOBS side by side; then one bench per (model, dataset)
  local db="sqlite:///called.db"
  python3 -c "from rgtune.db import TrialDatabase as T; T('$db').close()"
  for m in rgcn rgat hgt; do for d in aifb mutag; do for mode in inference training; do
    echo "--model $m --dataset $d --mode $mode"; done; done; done \
    | OMP_NUM_THREADS=1 xargs -P "$JOBS" -L 1 python3 -m rgtune.cli tune --backend cuda --hidden 64 \
      --time-budget "${CALLED_BUDGET:-45}" --quiet --db "$db"
  for m in rgcn rgat hgt; do for d in aifb mutag; do
    python3 -m rgtune.cli bench --model "$m" --dataset "$d" --hidden 64 --backend cuda --db "$db" \
      --impls rgtune,pyg --repeats 20 --no-write --json "$OUT/called_bench.jsonl"
  done; done
  cp called.db "$OUT/"
}

step_reuse() {
  python3 experiments/edge_stores.py --backend cuda --models rgat,hgt --datasets aifb,mutag --hidden 16,64 \
    --rounds 7 --json "$OUT/edge_stores_gpu.jsonl"
}

for step in "$@"; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  t0=$SECONDS
  "step_$step" 2>&1 | tee "$OUT/$step.log"
  echo "=== $step done in $((SECONDS - t0)) s"
done

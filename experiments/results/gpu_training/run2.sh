#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT" logs
export PYTHONUNBUFFERED=1 RGTUNE_DATA_DIR=$PWD/.data/datasets RGTUNE_CACHE_DIR=$PWD/.data/processed
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > logs/setup.log 2>&1
export PYTHONPATH=/tmp/site:$PWD
for d in aifb mutag; do
  timeout 200 python3 -m rgtune.cli tune --model rgat --dataset $d --mode training --trials 40 --backend cuda \
    --db sqlite:///gpu_rgat_$d.db --cost-model off --confirm 0 --quiet > logs/tune_rgat_$d.log 2>&1 &
done
timeout 240 python3 -m pytest -q -ra -p no:cacheprovider -o addopts="" -m gpu tests/test_cuda_training.py --durations=15 > logs/gpu_training_tests.log 2>&1 &
timeout 240 python3 -m pytest -q -ra -p no:cacheprovider -o addopts="" tests/test_cuda_gpu.py --durations=10 > logs/gpu_forward_tests.log 2>&1 &
wait
echo "tests+tunes done at $SECONDS s"; tail -3 logs/gpu_training_tests.log logs/gpu_forward_tests.log
for d in aifb mutag; do
  timeout 40 python3 -m rgtune.cli bench --model rgat --dataset $d --backend cuda --db sqlite:///gpu_rgat_$d.db \
    --impls rgtune,torch,pyg --repeats 10 --warmup 3 --json "$OUT/gpu_bench2.jsonl" --output BENCHMARKS.md > logs/bench_rgat_$d.log 2>&1
done
tar czf "$OUT/logs.tgz" logs BENCHMARKS.md
echo "all done at $SECONDS s"

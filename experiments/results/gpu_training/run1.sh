#!/usr/bin/env bash
# One device call: setup, GPU tests (training + forward), training tunes (side by side), benches.
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RGTUNE_DATA_DIR=$PWD/.data/datasets RGTUNE_CACHE_DIR=$PWD/.data/processed
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$OUT/setup.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
  python3 -c "import torch, torch_geometric, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'pyg', torch_geometric.__version__)"; } >> "$OUT/setup.log" 2>&1
echo "setup done $SECONDS s"
# training tunes in the background (the GPU lock serializes their timing); 20 trials each
for m in rgcn rgat hgt; do for d in aifb mutag; do
  timeout 260 python3 -m rgtune.cli tune --model $m --dataset $d --mode training --trials 20 --backend cuda \
    --db sqlite:///gpu_${m}_${d}.db --cost-model off --confirm 0 --quiet > "$OUT/tune_${m}_${d}.log" 2>&1 &
done; done
timeout 200 python3 -m pytest -q -ra -p no:cacheprovider -o addopts="" -m gpu tests/test_cuda_training.py tests/test_cuda_gpu.py > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$? at $SECONDS s"; tail -3 "$OUT/gpu_tests.log"
wait
echo "tunes done at $SECONDS s"
for m in rgcn rgat hgt; do for d in aifb mutag; do
  timeout 45 python3 -m rgtune.cli bench --model $m --dataset $d --backend cuda --db sqlite:///gpu_${m}_${d}.db \
    --impls rgtune,torch,pyg --repeats 10 --warmup 3 --json "$OUT/gpu_bench.jsonl" --output BENCHMARKS.md > "$OUT/bench_${m}_${d}.log" 2>&1
  echo "bench $m $d rc=$? at $SECONDS s"
done; done
cp BENCHMARKS.md "$OUT/"; cp gpu_*.db "$OUT/" 2>/dev/null
echo "all done at $SECONDS s"

#!/usr/bin/env bash
# The GPU check of the decode engine, in one run of at most 8 minutes (not a test).
#
# What it runs, with random bf16 weights at the real models' shapes:
#   0. bench/device_probe.py: the first op, a matmul, GPT-XL's random weights, one forward
#      and one vanilla decode, each compile and run timed apart (tells a slow start from a
#      stalled one);
#   1. bench/engine.py --preset=llamagen-xl  (forward latency at T = 1 and k + 1 against the
#      weight-read floor, SD iterations, vanilla whole-image latency, compile times);
#   2. bench/engine.py --preset=lumina-7b;
#   3. bench/methods_at_scale.py: every method of the main command at LlamaGen-XL shapes
#      (ms per image, per iteration and per token against vanilla's ms per token).
# Each stage has its own time limit; a stage that runs out leaves what it wrote. Every
# stage's whole output, with its Python stack every 30 s, goes to stages.log.
# STAGES="probe engine-llamagen-xl" (names as in the log) runs only those.
# JSON goes to $OUT when set (the device tool's result folder), else to
# bench/results/accelerator/; commit it under bench/results/accelerator/.
#
# On the lent GPU machine (jax with CUDA preinstalled, no package registry), from the
# repository root, carrying the ml_collections wheel the image lacks:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl ml_collections
#   device run: carry=['.whl'], command='bash bench/accelerator_check.sh', timeout_s=540
# The package is not installed there: bench/with_tree.py maps specdec_jax (and its models,
# converters, configs) to this checkout.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results/accelerator}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

if ! "$python" -c 'import ml_collections' 2>/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --target /tmp/site .whl/ml_collections*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
    || echo 'warning: ml_collections is missing and no wheel was carried; stage 3 will fail'
fi

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  "$python" -c 'import jax; print("jax", jax.__version__, jax.devices())'
} > "$out/environment.txt" 2>&1

export BENCH_TRACEBACK_EVERY_S=${BENCH_TRACEBACK_EVERY_S:-30}
stage() {  # stage SECONDS NAME SCRIPT ARGS...: one bench script under a time limit
  local seconds=$1 name=$2 begin=$SECONDS
  shift 2
  if [ -n "${STAGES:-}" ] && [[ " $STAGES " != *" $name "* ]]; then return; fi
  echo "== $name (limit ${seconds}s)" | tee -a "$out/log.txt" >> "$out/stages.log"
  timeout "$seconds" "$python" bench/with_tree.py . "$@" >> "$out/stages.log" 2>&1
  local rc=$?
  echo "== $name exit $rc after $((SECONDS - begin)) s" | tee -a "$out/log.txt" >> "$out/stages.log"
}

# SMOKE=1: tiny shapes, to check this script on a CPU (tests/test_accelerator_check.py);
# SMOKE_BUDGET_S: seconds after which methods-tiny starts no new method (default 60).
if [ "${SMOKE:-0}" = 1 ]; then
  stage 300 engine-tiny bench/engine.py --preset=tiny --out="$out/engine_tiny.json"
  stage 600 methods-tiny bench/methods_at_scale.py --preset=tiny --budget_s="${SMOKE_BUDGET_S:-60}" \
    --out="$out/methods_tiny.json"
else
  stage 60 probe bench/device_probe.py --out="$out/probe.json"
  stage 125 engine-llamagen-xl bench/engine.py --preset=llamagen-xl \
    --out="$out/engine_llamagen_xl.json"
  stage 125 engine-lumina-7b bench/engine.py --preset=lumina-7b --out="$out/engine_lumina_7b.json"
  stage 165 methods-xl bench/methods_at_scale.py --budget_s=125 --out="$out/methods_xl.json"
fi
ls -l "$out"

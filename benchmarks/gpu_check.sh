#!/usr/bin/env bash
# The device check: everything in this repository that needs a GPU, as one command of a few minutes on one GPU.
#
#   bash benchmarks/gpu_check.sh             # on a machine with CUDA; tables and logs in gpu-check/
#   bash benchmarks/gpu_check.sh --dry-run   # the same steps on the CPU at tiny sizes (CI runs it: it cannot rot)
#
# Steps, each printing its failures as they happen and writing its table or log under $OUT (default gpu-check/):
#   1. the training tests on the device (python -m pytest --device cuda): every failing test's name as it fails;
#   2. the benchmark table at the sizes people train (LSTM 1024 x 2 layers, vocabulary 10,000, batch 64), float32
#      and bfloat16 autocast;
#   3. the launch-bound table (benchmarks.graphs): a GRU of 8 units, eager loops against CUDA graphs;
#   4. the profile of one configuration (benchmarks.profile), the trainer's ranges first;
#   5. the main job on the device for one epoch, its bits per character and time, eager and with --cuda-graphs
#      (k1 = k2 = 50, its default; not in the dry run: the CPU has no graphs).
# A step that fails does not stop the others; the script exits non-zero if any failed, naming them.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
OUT=${OUT:-gpu-check}
if [[ "${1:-}" == "--dry-run" ]]; then
    DEVICE=cpu
    TESTS=(tests/runtime/test_loss_sum.py tests/runtime/test_hidden.py tests/engine/test_cuda_graphs.py)
    SIZES=(--quick --pairs 25/25)
    PROFILE=(--hidden 16 --steps 200 --k1 20 --k2 30)
    MAIN=(--max-chars 20000 --hidden 16 --epochs 1 --checkpoint-every 0 --no-progress)
    GRAPHS=(--repeats 1 --steps 400)
else
    DEVICE=${DEVICE:-cuda}
    TESTS=(tests/engine tests/handlers tests/runtime tests/data tests/planning tests/examples)
    SIZES=(--hidden 1024 --layers 2 --vocab 10000 --batch 64 --steps 600 --repeats 3)
    PROFILE=(--hidden 1024 --layers 2 --vocab 10000 --batch 64 --k1 25 --k2 50 --fused)
    MAIN=(--epochs 1 --checkpoint-every 0 --no-progress)
    GRAPHS=(--repeats 5)
fi
mkdir -p "$OUT"
failed=()

step() {  # step NAME COMMAND...: run it, its output to the terminal and to $OUT/NAME.log
    local name=$1
    shift
    echo "== $name: $*"
    local start=$SECONDS
    if "$@" 2>&1 | tee "$OUT/$name.log"; then
        echo "== $name: done in $((SECONDS - start)) s"
    else
        echo "== $name: FAILED after $((SECONDS - start)) s"
        failed+=("$name")
    fi
}

# -v prints each test's outcome as it ends; the filter keeps the failures, so each is seen when it happens.
step tests bash -c "$PYTHON -m pytest --device $DEVICE -p no:cacheprovider -v --tb=line ${TESTS[*]} \
    | grep -E --line-buffered 'FAILED|ERROR|passed|failed|error' ; exit \${PIPESTATUS[0]}"
step table-float32 "$PYTHON" -m benchmarks.run --device "$DEVICE" --cells lstm --no-memory "${SIZES[@]}" \
    --out "$OUT/table-float32.json" --markdown "$OUT/table-float32.md"
step table-bfloat16 "$PYTHON" -m benchmarks.run --device "$DEVICE" --cells lstm --no-memory "${SIZES[@]}" \
    --autocast bfloat16 --out "$OUT/table-bfloat16.json" --markdown "$OUT/table-bfloat16.md"
step graphs "$PYTHON" -m benchmarks.graphs --device "$DEVICE" "${GRAPHS[@]}" --markdown "$OUT/graphs.md"
step profile "$PYTHON" -m benchmarks.profile --device "$DEVICE" "${PROFILE[@]}"
step main-job "$PYTHON" -m ignite_tbptt.examples.char_lm --device "$DEVICE" --logdir "$OUT/runs" "${MAIN[@]}"
if [[ "$DEVICE" == cuda* ]]; then
    step main-job-graphs "$PYTHON" -m ignite_tbptt.examples.char_lm --device "$DEVICE" --cuda-graphs \
        --logdir "$OUT/runs-graphs" "${MAIN[@]}"
fi

if ((${#failed[@]})); then
    echo "== failed: ${failed[*]}"
    exit 1
fi
echo "== every step passed; tables and logs in $OUT/"

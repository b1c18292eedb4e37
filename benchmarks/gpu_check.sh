#!/usr/bin/env bash
# The device check: everything in this repository that needs a GPU, as one command of a few minutes on one GPU.
#
#   bash benchmarks/gpu_check.sh             # on a machine with CUDA; tables and logs in gpu-check/
#   bash benchmarks/gpu_check.sh --dry-run   # the same steps on the CPU at tiny sizes (the suite runs it, but for
#                                            # the fla steps, which on the CPU run tests the suite runs itself)
#   ONLY="tests profile" bash benchmarks/gpu_check.sh   # those steps alone, the others' output in $OUT kept
#
# Steps, each printing its failures as they happen and writing its table or log under $OUT (default gpu-check/):
#   1. the training tests on the device (python -m pytest --device cuda): every failing test's name as it fails; the
#      CUDA-graph tests in a pytest of their own (graph-tests); flash-linear-attention's models and Triton kernels in
#      one of their own (fla-tests, the adapter's and the fla example's), which fails if fla cannot be imported
#      (pip install --no-deps fla-core flash-linear-attention) rather than skipping them; the fla example's
#      comparison, fla's model (state carried, and on chunks), the main job's LSTM and Hugging Face's Mamba2 trained
#      30 s each (fla-example; in the dry run, its test on fla's PyTorch references);
#   2. the benchmark table at the sizes people train (LSTM 1024 x 2 layers, vocabulary 10,000, batch 64), float32
#      and bfloat16 autocast;
#   3. the launch-bound table (benchmarks.graphs): a GRU of 8 units, eager loops against CUDA graphs, k1 = k2 and
#      k2 > k1 (eager windows and step programs against the exact hand loop captured whole: the evidence that would
#      bring window programs of k2 > k1 back); the prequential study's per-token TBPTT(1, 25) against TBPTT(25, 25), eager and with graphs
#      (benchmarks.tradeoff.online_device, its quick stream: 30,000 characters);
#   4. the profile of one configuration (benchmarks.profile), the trainer's ranges first;
#   5. the main job on the device for one epoch, its bits per character and time, eager and with --cuda-graphs
#      (k1 = k2 = 50, its default; not in the dry run: the CPU has no graphs);
#   6. the page (benchmarks.cuda_page): $OUT/benchmarks-cuda.md, to copy to docs/benchmarks-cuda.md.
# A step that fails, or runs past its time limit (STEP_LIMIT seconds, the tests TEST_LIMIT), does not stop the others;
# the script exits non-zero if any failed, naming them. Where pytest-xdist is installed the tests run in WORKERS
# processes (default 8) sharing the GPU; where pytest-timeout is, a test that hangs fails after 240 s (not sooner:
# the Ctrl-C test starts ten jobs, each initialising CUDA).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
OUT=${OUT:-gpu-check}
if [[ "${1:-}" == "--dry-run" ]]; then
    DEVICE=cpu
    TESTS=(tests/runtime/test_loss_sum.py tests/runtime/test_hidden.py)
    FLA_TESTS=(tests/models/test_fla.py -k chunked)  # fla's PyTorch-reference kernels; without fla, skipped
    # The graph tests run whole in the suite itself (recorded): here, that the step's command works, on one test.
    GRAPH_PICK=(-k recorded-3-True)  # test_programs_give_the_eager_parameters, alone (no spaces: bash -c "$*")
    # fla's example refuses the CPU: its comparison runs on the reference kernels, through its test.
    FLA_EXAMPLE=(-m pytest -p no:cacheprovider -o addopts= -q -s tests/examples/test_fla_lm.py -k comparison)
    FLA_NEEDED=""
    SIZES=(--quick --pairs 25/25)
    PROFILE=(--hidden 16 --steps 200 --k1 20 --k2 30)
    MAIN=(--max-chars 20000 --hidden 16 --epochs 1 --checkpoint-every 0 --no-progress)
    GRAPHS=(--repeats 1 --steps 200 --reaching-steps 200)
    PREQUENTIAL=(--quick --batches 2)
else
    DEVICE=${DEVICE:-cuda}
    GRAPH_PICK=()  # every graph test
    TESTS=(tests/engine tests/handlers tests/runtime tests/data tests/planning tests/examples tests/models)
    FLA_TESTS=(tests/models/test_fla.py tests/examples/test_fla_lm.py)
    FLA_EXAMPLE=(-m ignite_tbptt.examples.fla_lm --device "$DEVICE" --compare --seconds 30)
    FLA_NEEDED="$PYTHON -c 'import fla.models' && "  # on the device, an fla that cannot be imported fails the step
    SIZES=(--hidden 1024 --layers 2 --vocab 10000 --batch 64 --steps 600 --repeats 3 --pairs 25/25 25/50 10/40 20/30)
    PROFILE=(--hidden 1024 --layers 2 --vocab 10000 --batch 64 --k1 25 --k2 50 --fused)
    MAIN=(--epochs 1 --checkpoint-every 0 --no-progress)
    GRAPHS=(--repeats 5)
    PREQUENTIAL=(--quick)
fi
STEP_LIMIT=${STEP_LIMIT:-240}
TEST_LIMIT=${TEST_LIMIT:-420}  # the training tests took 3 min on one H100 in 8 workers; a test may take 240 s
GRAPH_TEST_LIMIT=${GRAPH_TEST_LIMIT:-540}  # about 250 tests, each capturing its programs: 200 s one-threaded on a CPU
FLA_LIMIT=${FLA_LIMIT:-480}  # not yet run on a GPU: Triton compiles and autotunes each fla kernel on first use
FLA_EXAMPLE_LIMIT=${FLA_EXAMPLE_LIMIT:-420}  # four models of 30 s, their data, evaluation and fla's compiles
PYTEST_EXTRA=()
if [[ "$DEVICE" != cpu ]]; then
    "$PYTHON" -c "import xdist" 2>/dev/null && PYTEST_EXTRA+=(-n "${WORKERS:-8}")
    "$PYTHON" -c "import pytest_timeout" 2>/dev/null && PYTEST_EXTRA+=(--timeout 240)
fi
STEPS="tests graph-tests fla-tests fla-example table-float32 table-bfloat16 graphs prequential profile main-job"
STEPS="$STEPS main-job-graphs page"
ONLY=${ONLY:-}  # step names, separated by spaces: run those alone (a check split over calls, or one step rerun)
for name in $ONLY; do
    [[ " $STEPS " == *" $name "* ]] || { echo "ONLY: no step named $name; the steps: $STEPS" >&2; exit 2; }
done
mkdir -p "$OUT"
if [[ -z $ONLY ]]; then  # a whole check: nothing an earlier one left may reach the page as this one's
    rm -f "$OUT"/{tests,graph-tests,fla-tests}{,-full}.log "$OUT"/{table-float32,table-bfloat16}.{log,json,md} \
        "$OUT"/graphs.{log,md} "$OUT"/{prequential,profile,main-job,main-job-graphs,fla-example,page}.log \
        "$OUT"/steps.tsv \
        "$OUT"/benchmarks-cuda.md
fi
failed=()

step() {  # step NAME COMMAND...: run it, its output to the terminal and to $OUT/NAME.log
    local name=$1 limit=$STEP_LIMIT
    shift
    [[ -n $ONLY && " $ONLY " != *" $name "* ]] && return 0
    # What an earlier run of this step left would otherwise reach the page as this one's.
    rm -f "$OUT/$name".{log,json,md} "$OUT/$name-full.log"
    [[ $name == page ]] && rm -f "$OUT/benchmarks-cuda.md"
    if [[ -f "$OUT/steps.tsv" ]]; then
        awk -F '\t' -v name="$name" '$1 != name' "$OUT/steps.tsv" >"$OUT/steps.tsv.new"
        mv "$OUT/steps.tsv.new" "$OUT/steps.tsv"
    fi
    [[ $name == tests ]] && limit=$TEST_LIMIT
    [[ $name == graph-tests ]] && limit=$GRAPH_TEST_LIMIT
    [[ $name == fla-tests ]] && limit=$FLA_LIMIT
    [[ $name == fla-example ]] && limit=$FLA_EXAMPLE_LIMIT
    echo "== $name: $*"
    local start=$SECONDS
    if timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"; then
        echo "== $name: done in $((SECONDS - start)) s"
        printf '%s\tdone\t%s\n' "$name" $((SECONDS - start)) >>"$OUT/steps.tsv"
    else
        echo "== $name: FAILED after $((SECONDS - start)) s"
        printf '%s\tFAILED\t%s\n' "$name" $((SECONDS - start)) >>"$OUT/steps.tsv"
        failed+=("$name")
    fi
}

# -v prints each test's outcome as it ends; the filter keeps the failures, so each is seen when it happens. The whole
# output, tracebacks included, goes to $OUT/NAME-full.log. The CUDA-graph tests run in a pytest of their own: a
# capture that fails can leave CUDA's random generator unusable in its process, failing every later test there.
GRAPH_TESTS=(tests/runtime/programs)
FLA_TEST=tests/models/test_fla.py  # fla's Triton kernels: a pytest of its own, one process (their compile cache)
FLA_EXAMPLE_TEST=tests/examples/test_fla_lm.py
on_device() {  # on_device NAME PYTEST-ARGS...: the command line of that pytest run, for bash -c
    local name=$1 shown='FAILED|ERROR|passed|failed|error'
    shift
    # The graph tests certify the wing on a GPU: every test's outcome as it ends, a skip (no capture) among them.
    [[ $name == graph-tests ]] && shown="PASSED|SKIPPED|XFAIL|XPASS|$shown"
    echo "$PYTHON -m pytest --device $DEVICE -p no:cacheprovider -o addopts= -v --tb=short -rfEs $* \
        | tee $OUT/$name-full.log | grep -E --line-buffered '$shown'; exit \${PIPESTATUS[0]}"
}
step tests bash -c "$(on_device tests "${PYTEST_EXTRA[@]}" "${TESTS[@]}" "${GRAPH_TESTS[@]/#/--ignore=}" \
    --ignore "$FLA_TEST" --ignore "$FLA_EXAMPLE_TEST")"
step graph-tests bash -c "$(on_device graph-tests "${GRAPH_TESTS[@]}" "${GRAPH_PICK[@]}")"
step fla-tests bash -c "$FLA_NEEDED$(on_device fla-tests "${FLA_TESTS[@]}")"
step fla-example "$PYTHON" "${FLA_EXAMPLE[@]}"  # fla both ways, the main job's LSTM and Mamba2: 30 s each
step table-float32 "$PYTHON" -m benchmarks.run --device "$DEVICE" --cells lstm --no-memory "${SIZES[@]}" \
    --out "$OUT/table-float32.json" --markdown "$OUT/table-float32.md"
step table-bfloat16 "$PYTHON" -m benchmarks.run --device "$DEVICE" --cells lstm --no-memory "${SIZES[@]}" \
    --autocast bfloat16 --out "$OUT/table-bfloat16.json" --markdown "$OUT/table-bfloat16.md"
step graphs "$PYTHON" -m benchmarks.graphs --device "$DEVICE" "${GRAPHS[@]}" --markdown "$OUT/graphs.md"
step prequential "$PYTHON" -m benchmarks.tradeoff.online_device --device "$DEVICE" "${PREQUENTIAL[@]}"
step profile "$PYTHON" -m benchmarks.profile --device "$DEVICE" "${PROFILE[@]}"
step main-job "$PYTHON" -m ignite_tbptt.examples.char_lm --device "$DEVICE" --logdir "$OUT/runs" "${MAIN[@]}"
if [[ "$DEVICE" == cuda* ]]; then
    step main-job-graphs "$PYTHON" -m ignite_tbptt.examples.char_lm --device "$DEVICE" --cuda-graphs \
        --logdir "$OUT/runs-graphs" "${MAIN[@]}"
fi

# The page: docs/benchmarks-cuda.md's text, from what the steps left (copy it there after a run on a GPU).
step page "$PYTHON" -m benchmarks.cuda_page "$OUT" --out "$OUT/benchmarks-cuda.md"

if ((${#failed[@]})); then
    echo "== failed: ${failed[*]}"
    exit 1
fi
echo "== every step passed; tables and logs in $OUT/"

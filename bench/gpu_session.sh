#!/usr/bin/env bash
# The device checks of a session lent a GPU, as the one command the device tool runs:
#
#     bash bench/gpu_session.sh            # on the device machine, from the repository root
#     GPU_SESSION_SMOKE=1 bash bench/gpu_session.sh   # here, on a CPU: the same steps, tiny
#
# The device machine has its own python3 with a CUDA torch, numpy, scipy, pandas, pyarrow,
# safetensors, nvidia-ml-py and pytest, but no Ray, MLflow or Optuna (and Ray's wheel is
# larger than what a call may carry). Every step below imports none of those: it runs from
# the working tree as it travels (PYTHONPATH, no install), without the packed sweep, which
# needs Ray. What each step writes goes to $OUT as it is written, so a run stopped by its
# timeout still returns what it measured. About 7 minutes with the default budgets (the
# first run, 2026-12-04: tests 31 s, the twenty rows 166 s, the fused slots of five
# families ~150 s; the second, 2026-12-05 on an H100: 365 s in all), so a 15-minute lease
# leaves room to start the machine and a short rerun.
#
# Files back in $OUT (at most 8 come back): env.txt, gpu_tests.log, gpu_packing.{log,json,md},
# group_trainer.log. What to do with them: bench/README.md ("GPU rows").
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-bench/results/gpu_session}
PYTHON=${PYTHON:-python3}
TESTS_S=${TESTS_S:-75}        # the CUDA-only tests (31 s on an H200)
PACKING_S=${PACKING_S:-300}   # bench/gpu_packing.py's --budget-s (rows, then fused slots)
GROUP_S=${GROUP_S:-100}       # bench/group_trainer.py on CUDA, best of 2
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"

if [[ -n ${GPU_SESSION_SMOKE:-} ]]; then
    packing=(--smoke --families tft,kan --slots 1 2)
    group=(--families kan --trials 2 --epochs 1 --steps 2 --repeats 1)
else
    # The three fusing families the first run's budget left untimed fused come first, so
    # their fused slots run before the budget stops the rest (the fused loop follows this
    # order); every family's rows still run first.
    packing=(--require-cuda --no-sweep
        --families mamba2,tlob,xlstm,diffusion,tft,kan,liquid,tggn,dqn,ppo)
    group=(--families liquid kan tggn --trials 4 8 --repeats 2 --device cuda)
fi

{
    date -u
    nvidia-smi || echo "no nvidia-smi"
    "$PYTHON" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__,
"cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
"device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
    git log -1 --format='commit %H %s' 2>/dev/null || true
} > "$OUT/env.txt" 2>&1

status=0
step() {  # step NAME SECONDS LOG COMMAND...: run, keep its output in LOG, remember a failure
    local name=$1 seconds=$2 log=$3
    shift 3
    echo "== $name (at most ${seconds} s)"
    timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee "$OUT/$log"
    local rc=${PIPESTATUS[0]}
    local why=""
    ((rc == 124 || rc == 137)) && why=" (its timeout stopped it; the rows above are kept)"
    echo "== $name: exit $rc$why" | tee -a "$OUT/$log"
    [[ $rc -eq 0 ]] || status=1
}

# The CUDA tests carry the gpu mark (tests/devices.py). Only the files that hold them are
# collected: most others import Ray or MLflow, which the device lacks.
# -v: one line per test as it ends, so a run its timeout stops still says which passed.
mapfile -t cuda_tests < <(grep -rlE --include='test_*.py' 'mark\.gpu|ON_CUDA' tests | sort)
if ((${#cuda_tests[@]} == 0)); then
    echo "no test file holds a gpu-marked test" | tee "$OUT/gpu_tests.log"
    status=1
else
    step "CUDA tests" "$TESTS_S" gpu_tests.log \
        "$PYTHON" -m pytest -p no:cacheprovider -v -ra --timeout=60 -m gpu "${cuda_tests[@]}"
fi
step "packing and fused-slot rows" "$((PACKING_S + 30))" gpu_packing.log \
    "$PYTHON" bench/gpu_packing.py "${packing[@]}" --budget-s "$PACKING_S" --out "$OUT"
step "group trials" "$GROUP_S" group_trainer.log \
    "$PYTHON" bench/group_trainer.py "${group[@]}"
exit $status

#!/usr/bin/env bash
# The lent GPU's one call: what runs there, in one command of under 9 minutes.
#
#   bash scripts/gpu_check.sh              # on the GPU machine (device tool: carry .kiln/gpu-shim)
#   bash scripts/gpu_check.sh --fake       # here, no GPU: the GPU tests (skipping), the benchmark's
#                                          # dry run, the agent flow on the fake driver
#   bash scripts/gpu_check.sh --make-shim  # here: (re)make .kiln/gpu-shim from .venv
#
# Stages, each time-boxed, each printing what it did and its exit status; a failed stage never
# stops the next: (0) the machine: nvidia-smi, nvcc, the Python and what it imports; (1) the GPU
# opened through our driver (without one: "no GPU", exit 2); (2) the GPU tests (pytest,
# tests/integration/test_cuda_gpu.py whole and the "gpu" tests of the other files that open a
# GPU); (3) benchmarks/cuda.py, its per-section budget fitted to the time left; (4) the agent
# flow on the real GPU: a tracker, `kiln-agent --backend cuda` and `kiln tune-op dense` with
# the check on. Everything goes to stdout and, where $OUT is set (the device tool's folder),
# to $OUT/gpu_check.log, with $OUT/summary.txt holding one line per stage and the benchmark's
# final `cuda:` line.
#
# The Python: .venv/bin/python when it runs there, else the machine's python3 (a carried .venv
# is 684 MB, over the tool's 64 MiB, and its interpreter lives outside it). What that python3
# lacks comes from .kiln/gpu-shim (`--make-shim`, 19 MB, pure or abi3 code): xgboost (the
# tuner's cost model) and grpc_health on PYTHONPATH, protobuf too if the generated
# protos/*_pb2.py refuse the machine's, and a sitecustomize that lifts the generated
# *_pb2_grpc.py's version guard if the machine's grpcio is older than theirs.
#
# GPU_CHECK_PYTHON=PATH names the interpreter instead (a rehearsal of the machine's here).
# Limits (seconds; environment overrides): GPU_CHECK_TOTAL_S=530 in all, GPU_CHECK_TESTS_S=150,
# GPU_CHECK_FLOW_S=75 (kept back at least for stage 4, which takes all that is left: `kiln
# tune-op`, then `kiln tune` of ResNet-18 and BERT-tiny, GPU_CHECK_MODEL_TRIALS=36 and half
# (0: no model flow), GPU_CHECK_MODEL_S=150 each; records and logs come back even when its time
# runs out),
# GPU_CHECK_SECTION_MAX_S=90 per benchmark section; GPU_CHECK_SECTIONS=gemm,fp16 runs only those
# sections (none: no benchmark; GPU_CHECK_BENCH_ARGS="--trials 160" adds words to
# benchmarks/cuda.py's command line), GPU_CHECK_SKIP_TESTS=1 skips stage 2 (reruns after a change).

set -u
set -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
SHIM="$ROOT/.kiln/gpu-shim"
MODE="gpu"
case "${1:-}" in
  --fake) MODE="fake" ;;
  --make-shim) MODE="shim" ;;
  "") ;;
  *) echo "usage: bash scripts/gpu_check.sh [--fake | --make-shim]" >&2; exit 2 ;;
esac

make_shim() {
  local sp
  sp="$(ls -d "$ROOT"/.venv/lib/python3*/site-packages 2>/dev/null | head -1)"
  if [ -z "$sp" ]; then echo "gpu_check: no .venv here to make the shim from" >&2; return 1; fi
  rm -rf "$SHIM"
  mkdir -p "$SHIM/extra" "$SHIM/protobuf/google"
  cp -r "$sp/xgboost" "$sp/grpc_health" "$SHIM/extra/" || return 1
  cp -r "$sp"/xgboost*.libs "$SHIM/extra/" 2>/dev/null
  cp -r "$sp/google/protobuf" "$SHIM/protobuf/google/" || return 1
  # a regular package that still finds google.* portions elsewhere on the path, listed first
  echo '__path__ = __import__("pkgutil").extend_path(__path__, __name__)' \
    >"$SHIM/protobuf/google/__init__.py"
  mkdir -p "$SHIM/grpc-guard"
  cat >"$SHIM/grpc-guard/sitecustomize.py" <<'EOF'
"""scripts/gpu_check.sh only, for a grpcio older than the one protos/*_pb2_grpc.py were made
with: lift their version guard (it compares version strings; the wire protocol is the same)."""
try:
    import grpc._utilities

    grpc._utilities.first_version_is_lower = lambda *versions: False
except Exception:
    pass
EOF
  find "$SHIM" -name __pycache__ -prune -exec rm -rf {} +
  echo "gpu_check: made $SHIM ($(du -sh "$SHIM" | cut -f1)); carry .kiln/gpu-shim to the GPU"
}

if [ "$MODE" = "shim" ]; then make_shim; exit $?; fi

TOTAL_S="${GPU_CHECK_TOTAL_S:-530}"
TESTS_S="${GPU_CHECK_TESTS_S:-150}"
FLOW_S="${GPU_CHECK_FLOW_S:-75}"
MODEL_TRIALS="${GPU_CHECK_MODEL_TRIALS:-36}"  # resnet18's; bert_tiny gets half
MODEL_S="${GPU_CHECK_MODEL_S:-150}"  # each model's tune, build, run and check
export MODEL_TRIALS MODEL_S
SECTIONS="${GPU_CHECK_SECTIONS:-}"  # e.g. "gemm": only these benchmark sections, each given
# GPU_CHECK_SECTION_MAX_S (a rerun after a change); "none": no benchmark; empty: all four,
# fitted to the time left
SKIP_TESTS="${GPU_CHECK_SKIP_TESTS:-0}"  # 1: no GPU tests (a rerun of the benchmark alone)
SECTION_MAX_S="${GPU_CHECK_SECTION_MAX_S:-90}"
START=$(date +%s)
SUMMARY=()
if [ -n "${OUT:-}" ] && mkdir -p "$OUT" 2>/dev/null; then
  exec > >(tee -a "$OUT/gpu_check.log") 2>&1
fi
export PYTHONUNBUFFERED=1

elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((TOTAL_S - $(elapsed))); }

# stage NAME LIMIT_S FUNCTION ARGS...: run it in a child bash under `timeout` (which ends the
# child's whole process group), print and note its status and time
stage() {
  local name="$1" limit="$2" t0 rc
  shift 2
  t0=$(date +%s)
  echo
  echo "== stage $name (limit ${limit} s, $(elapsed) s into the check)"
  timeout -k 10 "$limit" bash -c '"$@"' stage "$@"
  rc=$?
  [ "$rc" = 124 ] && echo "== $name: ran past its ${limit} s and was stopped"
  echo "== stage $name: exit $rc in $(($(date +%s) - t0)) s"
  SUMMARY+=("$name: exit $rc in $(($(date +%s) - t0)) s")
  return $rc
}

pick_python() {
  local cand
  for cand in ${GPU_CHECK_PYTHON:-} "$ROOT/.venv/bin/python" python3 python; do
    if "$cand" -c 'import numpy' >/dev/null 2>&1; then
      echo "$cand"
      return 0
    fi
  done
  return 1
}

machine() {
  date -u
  uname -srm
  if command -v nvidia-smi >/dev/null; then timeout 20 nvidia-smi; else echo "nvidia-smi: absent"; fi
  if command -v nvcc >/dev/null; then nvcc --version | tail -2; else echo "nvcc: not on PATH"; fi
  echo "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)'))"
  echo "PYTHONPATH=${PYTHONPATH:-}"
  "$PY" - <<'EOF'
import importlib
for name in ("numpy", "grpc", "google.protobuf", "grpc_health", "xgboost", "onnx", "pytest",
             "pytest_timeout", "xdist", "protos.agent_pb2", "tuner.search.cost_model"):
    try:
        mod = importlib.import_module(name)
        print(f"  import {name}: ok {getattr(mod, '__version__', '')}")
    except Exception as e:  # report and go on: each stage says what it misses
        print(f"  import {name}: FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
EOF
}


open_gpu() {
  "$PY" - <<'EOF'
from device_agent.backends.cuda_driver import CudaError, Gpu
try:
    gpu = Gpu.open()
except CudaError as e:
    print(f"gpu_check: no GPU here ({e})")
    raise SystemExit(2)
major, minor = gpu.compute_capability()
print(f"gpu_check: {gpu.name()}, sm_{major}{minor}, opened through device_agent's driver")
gpu.close()
EOF
}

gpu_tests() {
  local files=(tests/integration/test_cuda_gpu.py) others=() f xdist=()
  for f in $(grep -l "Gpu.open" -r tests --include='test_*.py' | sort); do
    [ "$f" = tests/integration/test_cuda_gpu.py ] || others+=("$f")
  done
  if "$PY" -c "import xdist" >/dev/null 2>&1; then xdist=(-n 4); fi
  echo "GPU tests: ${files[*]} (all) + ${others[*]:-} (-k gpu)"
  local rc=0
  # -p no:benchmark: the GPU machine's pytest-benchmark warns under xdist, and our
  # filterwarnings = error makes that warning an INTERNALERROR before any test runs
  "$PY" -m pytest -p no:cacheprovider -p no:benchmark -q -rs --timeout 120 "${xdist[@]}" \
    "${files[@]}" || rc=$?
  if [ ${#others[@]} -gt 0 ]; then
    "$PY" -m pytest -p no:cacheprovider -p no:benchmark -q -rs --timeout 120 -k gpu \
      "${others[@]}" || rc=$?
  fi
  return $rc
}

# wait_for PID FILE PATTERN: until FILE holds a line matching PATTERN (grep -E), at most 30 s,
# or until PID exits; true when the line came
wait_for() {
  local i
  for i in $(seq 150); do
    grep -qE "$3" "$2" 2>/dev/null && return 0
    kill -0 "$1" 2>/dev/null || break
    sleep 0.2
  done
  grep -qE "$3" "$2" 2>/dev/null
}

# agent_flow [fake]: a tracker, a cuda agent and `kiln tune-op dense` on it, all ended by pid
agent_flow() {
  local dir addr tpid apid rc env_=() check=()
  dir="$(mktemp -d /tmp/kiln-gpu-flow.XXXXXX)"
  if [ "${1:-}" = fake ]; then env_=(KILN_CUDA_DRIVER=fake); check=(--no-check); fi
  "$PY" -c "from protos.auth import write_secrets; write_secrets('$dir/pool.secrets')" || return 1
  "$PY" -m tracker --listen 127.0.0.1:0 --token-file "$dir/pool.secrets" \
    --ready-file "$dir/tracker.ready" >"$dir/tracker.log" 2>&1 &
  tpid=$!
  if ! wait_for "$tpid" "$dir/tracker.ready" .; then
    echo "agent flow: the tracker never became ready:"; tail -20 "$dir/tracker.log"
    kill "$tpid" 2>/dev/null; return 1
  fi
  addr="$(head -1 "$dir/tracker.ready")"
  env "${env_[@]}" "$PY" -m device_agent --tracker "$addr" --key gpu --backend cuda \
    --listen 127.0.0.1:0 --token-file "$dir/pool.secrets" --cache-dir "$dir/cache" \
    --ready-file "$dir/agent.ready" >"$dir/agent.log" 2>&1 &
  apid=$!
  # the stage's `timeout` sends TERM: collect first (records and log of a run cut short)
  trap 'echo "agent flow: stopped by its time limit"; kill "$FLOW_CHILD" 2>/dev/null
    flow_collect "$dir" "$apid" "$tpid"; exit 124' TERM
  # the ready file means serving; the pool sees the device once the agent has registered
  if wait_for "$apid" "$dir/agent.ready" . && wait_for "$apid" "$dir/agent.log" "registered with tracker"; then
    echo "agent flow: tracker $addr, agent pid $apid ${env_[*]}"
    "$PY" -m kiln devices --tracker "$addr" --token-file "$dir/pool.secrets"
    in_child timeout 120 "$PY" -m kiln tune-op dense --shape 1024,1024,1024 --tracker "$addr" --key gpu \
      --token-file "$dir/pool.secrets" --trials 8 --records "$dir/records.jsonl" "${check[@]}"
    rc=$?
    echo "agent flow: kiln tune-op exit $rc; $(wc -l <"$dir/records.jsonl" 2>/dev/null || echo 0) records"
    model_flow "$dir" "$addr" "${check[@]}" || rc=$?
  else
    echo "agent flow: the agent never became ready and registered"; rc=1
  fi
  flow_collect "$dir" "$apid" "$tpid"
  return $rc
}

# in_child CMD...: CMD in the background, waited for: bash runs a trap only between commands,
# but a signal cuts a `wait` short (and a `timeout` in CMD heads a process group of its own, which
# the stage's TERM does not reach: the trap passes it on)
in_child() {
  "$@" &
  FLOW_CHILD=$!
  wait "$FLOW_CHILD"
}

# flow_collect DIR AGENT_PID TRACKER_PID: end the two, and bring back what failed, if anything
# (the records with their errors, the agent's log); also run when the stage's time runs out
flow_collect() {
  local dir="$1" f
  kill "$2" "$3" 2>/dev/null
  wait "$2" "$3" 2>/dev/null
  echo "agent flow: the agent's log ends:"; tail -8 "$dir/agent.log"
  for f in "$dir"/*.jsonl; do
    [ -e "$f" ] || continue
    timeout 20 "$PY" -m kiln records summary "$f" | head -30
    [ -n "${OUT:-}" ] && cp "$f" "$OUT/flow_$(basename "$f")"
  done
  [ -n "${OUT:-}" ] && cp "$dir/agent.log" "$OUT/flow_agent.log"
  rm -rf "$dir"
}

# model_flow DIR ADDR: whole models through the GPU agent: `kiln tune MODEL --key gpu` tunes the
# GPU build's template tasks on the device (each candidate checked against the host reference),
# builds the model from the records, runs it on the device and compares it with onnxruntime
# (on the fake driver: --no-check, which computes nothing)
model_flow() {
  local dir="$1" addr="$2" check="${3:---check}" rc=0 name trials
  if [ "$MODEL_TRIALS" -lt 2 ]; then
    echo "model flow: skipped (GPU_CHECK_MODEL_TRIALS=$MODEL_TRIALS)"
    return 0
  fi
  "$PY" -m kiln models export -o "$dir/models" resnet18 bert_tiny || return 1
  for name in resnet18 bert_tiny; do
    trials=$([ "$name" = resnet18 ] && echo "$MODEL_TRIALS" || echo $((MODEL_TRIALS / 2)))
    echo "model flow: kiln tune $name.onnx --key gpu --trials $trials"
    in_child timeout "$MODEL_S" "$PY" -m kiln tune "$dir/models/$name.onnx" --tracker "$addr" --key gpu \
      --token-file "$dir/pool.secrets" --trials "$trials" "$check" \
      --records "$dir/$name.records.jsonl" || { rc=$?; echo "model flow: $name exit $rc"; }
  done
  return $rc
}

bench() {
  "$PY" benchmarks/cuda.py "$@" | tee "$WORK/bench.log"
  local rc=$?
  [ -n "${OUT:-}" ] && cp "$WORK/bench.log" "$OUT/cuda_bench.log" 2>/dev/null
  return $rc
}

finish() {
  local line=""
  if [ -e "$WORK/bench.log" ]; then
    line="$(grep -h '^cuda: gemm_min_ratio' "$WORK/bench.log" | tail -1)"
    BENCH_LINE="${line:-cuda: (no final line: the benchmark did not finish)}"
  fi
  echo
  echo "== gpu_check: $(elapsed) s in all ($MODE)"
  printf '  %s\n' "${SUMMARY[@]}"
  [ -n "$BENCH_LINE" ] && echo "$BENCH_LINE"
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    { printf '%s\n' "${SUMMARY[@]}"; echo "$BENCH_LINE"; } >"$OUT/summary.txt"
  fi
}

PY="$(pick_python)" || { echo "gpu_check: no Python with numpy here"; exit 1; }
export PYTHONPATH="$ROOT"
if [ -d "$SHIM/extra" ]; then
  for mod in xgboost grpc_health; do
    if ! "$PY" -c "import $mod" >/dev/null 2>&1; then
      PYTHONPATH="$PYTHONPATH:$SHIM/extra"
      break
    fi
  done
fi
if ! "$PY" -c "import protos.agent_pb2" >/dev/null 2>&1 && [ -d "$SHIM/protobuf" ]; then
  if PYTHONPATH="$SHIM/protobuf:$PYTHONPATH" "$PY" -c "import protos.agent_pb2" >/dev/null 2>&1
  then
    PYTHONPATH="$SHIM/protobuf:$PYTHONPATH"
    echo "gpu_check: the machine's protobuf is refused by protos/*_pb2.py; using .kiln/gpu-shim's"
  fi
fi
if ! "$PY" -c "import protos.agent_pb2_grpc" >/dev/null 2>&1 && [ -d "$SHIM/grpc-guard" ]; then
  if PYTHONPATH="$SHIM/grpc-guard:$PYTHONPATH" "$PY" -c "import protos.agent_pb2_grpc" \
    >/dev/null 2>&1; then
    PYTHONPATH="$SHIM/grpc-guard:$PYTHONPATH"
    echo "gpu_check: the machine's grpcio is older than protos/*_pb2_grpc.py's; version guard lifted"
  fi
fi
export PYTHONPATH PY ROOT START
BENCH_LINE=""
WORK="$(mktemp -d /tmp/kiln-gpu-check.XXXXXX)"
export WORK
export -f elapsed machine open_gpu gpu_tests wait_for agent_flow in_child flow_collect model_flow \
  bench

stage machine 60 machine

if [ "$MODE" = fake ]; then
  echo "gpu_check --fake: no GPU is used; the benchmark builds only, the agent runs the fake driver"
  stage gpu-tests-collect "$TESTS_S" gpu_tests  # they skip without a GPU: imports, collection
  stage benchmark-dry-run 300 bench --dry-run --quick --budget-s 60
  stage agent-flow-fake "$FLOW_S" agent_flow fake
  finish
  exit 0
fi

if ! stage open-gpu 60 open_gpu; then
  echo "gpu_check: no GPU here: nothing to check (the GPU tests and the benchmark need one)"
  finish
  exit 2
fi
[ "$SKIP_TESTS" = 1 ] || stage gpu-tests "$TESTS_S" gpu_tests
# what is left, less stage 4's share and a margin, split over the 4 sections (each child may
# run ~10 s past its budget: start, CUDA context, cuBLAS, last rounds)
BENCH_S=$(($(left) - FLOW_S - 15))
SECTION_S=$(((BENCH_S - 40) / 4))
[ "$SECTION_S" -gt "$SECTION_MAX_S" ] && SECTION_S="$SECTION_MAX_S"
if [ "$SECTIONS" = none ]; then
  echo "gpu_check: GPU_CHECK_SECTIONS=none: no benchmark"
elif [ -n "$SECTIONS" ]; then
  # shellcheck disable=SC2086  # GPU_CHECK_BENCH_ARGS: more words for benchmarks/cuda.py
  stage benchmark "$BENCH_S" bench --sections "$SECTIONS" --budget-s "$SECTION_MAX_S" \
    --total-s "$((BENCH_S - 10))" ${GPU_CHECK_BENCH_ARGS:-}
elif [ "$SECTION_S" -lt 20 ]; then
  echo "gpu_check: only $BENCH_S s left for the benchmark: its quick run"
  stage benchmark "$((BENCH_S > 40 ? BENCH_S : 40))" bench --quick --budget-s 20 \
    --total-s "$((BENCH_S > 40 ? BENCH_S - 10 : 30))"
else
  stage benchmark "$BENCH_S" bench --budget-s "$SECTION_S" --total-s "$((BENCH_S - 10))"
fi
# stage 4 takes all that is left: FLOW_S is only what the benchmark leaves it at least
FLOW_LIMIT=$(($(left) - 5))
if [ "$FLOW_LIMIT" -ge 20 ]; then
  stage agent-flow "$FLOW_LIMIT" agent_flow
else
  echo "gpu_check: no time left for the agent flow"
fi
finish
exit 0

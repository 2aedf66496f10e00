#!/usr/bin/env bash
# GPU benchmarks and readiness checks on one GPU, sized for one 15-minute device window with room
# for a rerun: the whole script stays under TOTAL_S (default 420 s); each part gets min(its own
# limit, what is left of TOTAL_S). Headline parts first, compile-heavy parts last.
#
#   bash bench/gpu.sh            # from anywhere; runs in the repository root
#   bash bench/gpu.sh --travel   # only print what must travel with it, and exit
#   PARTS=decode_step,multi_agent bash bench/gpu.sh   # a rerun of some parts only
#
# 0. what must travel (wheels in .whl/), nvidia-smi, torch/CUDA and package versions;
# 1. train_step: bench/train_step.py --model smollm2-shape, ours (mas.decode=static_graph) vs TRL
#    GRPOTrainer (GSPO) with model.generate AND with transformers continuous batching, bf16, 4
#    prompts x G=8, 128 tokens, 4 optimizer steps per generation, 3 timed steps; update, pi_old,
#    optimizer seconds and peak memory printed apart;
# 2. decode_step: ms per decode step of 32 rows, ours (dynamic, and the captured static-graph step,
#    its first-capture time apart) vs model.generate;
# 3. multi_agent: the results profile's episodes (3 agents x 2 rounds, 64-token messages) played by
#    our engine vs a TRL rollout_func with one model.generate per round;
# 4. rollout_rows: tokens/s of the static-graph decoder vs model.generate at 128 and 512 rows;
# 5. mfu: DeepSpeed ZeRO-2 bf16 training MFU on a Qwen2.5-0.5B shape vs a measured matmul peak;
# 6. gpu_train: the GSPO trainer end to end through DeepSpeed ZeRO-2 (readiness check);
# 7. static_cache (optional, last: torch.compile): gpu_train with mas.static_cache=true. Skipped
#    without failing when the budget is spent.
#
# Without CUDA every part runs its CPU logic check instead (tiny models, a few steps): that is
# how the script itself is tested off the GPU. Logs and summary.txt go to $OUT (when the device
# tool sets it) or /tmp/bench-gpu; one summary table ends the output. Exit status: 0 when every
# part ran (targets missed or not), 1 when a part failed, timed out or (not optional) was skipped.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
T0=$SECONDS
TOTAL_S=${TOTAL_S:-420}
OPTIONAL=",static_cache,"  # parts a spent budget may skip without failing the run

# Not on the GPU image (torch 2.11, transformers 5.17, accelerate, peft, numpy, pyarrow, pandas,
# matplotlib, safetensors, einops, msgpack, ninja, py-cpuinfo, psutil, xxhash, fsspec are there).
WHEELS_PYPI=(hjson==3.1.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
  datasets==5.0.1 dill==0.4.1 multiprocess==0.70.19 trl==1.16.0)
travel() {
  cat <<EOF
== what must travel with this script: Python wheels in .whl/ (about 6.5 MB; the device tool's carry: [".whl"])
   made on a machine with PyPI access, from the repository root:
     echo /.whl/ >> .git/info/exclude
     DS_BUILD_OPS=0 python3 -m pip wheel --no-deps --no-build-isolation deepspeed==0.19.8 -w .whl
     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
       -d .whl ${WHEELS_PYPI[*]}
   deepspeed (DS_BUILD_OPS=0: no op is compiled; the trainer passes a torch AdamW), its hjson and
   pydantic (+ pydantic-core, annotated-types, typing-inspection; also used by components.config),
   and trl with datasets, dill, multiprocess for train_step.py's TRL peer. Nothing else: the model
   is built from its config on the GPU, questions are synthetic unless data/gsm8k is carried.
EOF
}
if [ "${1:-}" = "--travel" ]; then
  travel
  exit 0
fi
KNOWN_PARTS=",train_step,decode_step,multi_agent,rollout_rows,mfu,gpu_train,static_cache,"
PARTS=${PARTS:-}
for name in ${PARTS//,/ }; do
  if [[ "$KNOWN_PARTS" != *",$name,"* ]]; then
    echo "gpu.sh: PARTS names an unknown part '$name' (parts: ${KNOWN_PARTS:1:-1})" >&2
    exit 2
  fi
done
travel

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu.sh: installing .whl/*.whl failed" >&2; exit 1; }
  export PYTHONPATH="/tmp/site:$PWD"
else
  echo "note: no .whl/*.whl here; packages missing from this machine make their parts fail (see above)"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
  DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_NO_ADVISORY_WARNINGS=1
LOGS="${OUT:-/tmp/bench-gpu}"
mkdir -p "$LOGS"
SUMMARY="$LOGS/summary.txt"
: >"$SUMMARY"
failed=0

nvidia-smi || echo "gpu.sh: nvidia-smi failed (no GPU driver here?)"
python3 - <<'PY' || failed=1
import importlib, torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device: "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
for name in ("transformers", "trl", "datasets", "accelerate", "deepspeed", "pydantic", "tokenizers", "hjson"):
    try:
        print(f"  {name} {getattr(importlib.import_module(name), '__version__', '?')}")
    except Exception as exc:  # report every missing package at once, then let the parts fail
        print(f"  {name}: NOT importable ({type(exc).__name__}: {exc})")
PY

if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  DEVICE=cuda
else
  DEVICE=cpu
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
  echo "note: no CUDA device: running the CPU logic checks (tiny models; static_cache decodes on the" \
       "static cache uncompiled: torch.compile is CUDA-only)" | tee -a "$SUMMARY"
fi

# part NAME SECONDS CMD...: run with min(SECONDS, time left) as wall-clock limit, log to $LOGS/NAME.log,
# keep its result lines and a row of the final table
TABLE=()
part() {
  local name=$1 limit=$2
  shift 2
  if [ -n "${PARTS:-}" ] && [[ ",$PARTS," != *",$name,"* ]]; then
    return
  fi
  local left=$((TOTAL_S - (SECONDS - T0) - 5))
  if [ "$left" -lt 20 ]; then
    if [[ "$OPTIONAL" == *",$name,"* ]]; then
      echo "$name: skipped, optional (only ${left}s of the ${TOTAL_S}s budget left)" | tee -a "$SUMMARY"
      TABLE+=("$name|skipped (optional)|0|-")
    else
      failed=1
      echo "$name: SKIPPED (only ${left}s of the ${TOTAL_S}s budget left)" | tee -a "$SUMMARY"
      TABLE+=("$name|SKIPPED|0|-")
    fi
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo
  echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
  local rc=${PIPESTATUS[0]} status=ok
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  if [ "$rc" -ne 0 ]; then
    failed=1
    status="FAILED (exit $rc)"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status="TIMED OUT (${limit}s)"
    echo "$name: $status, see $LOGS/$name.log" >>"$SUMMARY"
  fi
  grep -E '^(bench [a-z_0-9]+:|gpu_train:|static_cache:|checks:|graph check:|mfu:|peak:|settings:|profile |ours|peer|trl)' "$LOGS/$name.log" | sed "s/^/$name: /" >>"$SUMMARY" \
    || true
  local lines
  lines=$(grep -E '^(bench [a-z_0-9]+:|mfu:|gpu_train:)' "$LOGS/$name.log" | sed -E 's/^bench //' | paste -sd ';' -)
  TABLE+=("$name|$status|$((SECONDS - t0))|${lines:--}")
}

if [ "$DEVICE" = cuda ]; then
  part train_step 150 python3 bench/train_step.py --device cuda --model smollm2-shape --questions 4 --group 8 \
    --tokens 128 --minibatches 4 --steps 3 --repeats 1 --peers trl,trl_cb --decode static_graph
  part decode_step 50 python3 bench/decode_step.py --device cuda --rows 32 --prompt 128 --short 8 --long 40 --graph
  part multi_agent 60 python3 bench/multi_agent.py --device cuda --model smollm2-shape --questions 8 --group 8 \
    --repeats 2
  part rollout_rows 60 bash -c 'for r in 128 512; do python3 bench/decode_step.py --device cuda --rows $r \
    --prompt 128 --short 8 --long 24 --repeats 2 --graph-only || exit 1; done'
  part mfu 60 python3 bench/mfu.py --device cuda
  part gpu_train 80 python3 bench/gpu_train.py --device cuda --model smollm2-shape --zero-stage 2 --steps 3
  part static_cache 200 python3 bench/gpu_train.py --device cuda --model smollm2-shape --zero-stage 2 --steps 2 \
    --set mas.static_cache=true
else
  part train_step 150 python3 bench/train_step.py --device cpu --model tiny-random --questions 2 --group 4 \
    --tokens 8 --minibatches 2 --steps 1 --repeats 1 --peers trl,trl_cb --decode static_graph
  part decode_step 60 python3 bench/decode_step.py --device cpu --model tiny-random --rows 4 --prompt 16 --short 2 \
    --long 6 --profile --mask2d --engine --static --graph
  part multi_agent 60 python3 bench/multi_agent.py --device cpu --questions 1 --group 2 --tokens 4 --repeats 1
  part rollout_rows 60 bash -c 'for r in 8 16; do python3 bench/decode_step.py --device cpu --model tiny-random \
    --rows $r --prompt 16 --short 2 --long 6 --repeats 1 --graph-only || exit 1; done'
  part mfu 60 python3 bench/mfu.py --device cpu --tiny --steps 2 --warmup 1
  part gpu_train 120 python3 bench/gpu_train.py --device cpu --model tiny-random --steps 2 --questions 2 --group 2 \
    --rounds 1 --tokens 16
  part static_cache 120 python3 bench/gpu_train.py --device cpu --model tiny-random --steps 2 --questions 2 \
    --group 2 --rounds 1 --tokens 16 --set mas.static_cache=true
fi

echo
echo "== summary ($SUMMARY), $((SECONDS - T0)) s in all"
cat "$SUMMARY"
echo
echo "== table ($DEVICE, $((SECONDS - T0)) s of TOTAL_S=${TOTAL_S})"
printf '%-13s %-22s %5s  %s\n' part status s "result lines (ours, peer, ratio)"
for row in "${TABLE[@]}"; do
  IFS='|' read -r p st sec res <<<"$row"
  printf '%-13s %-22s %5s  %s\n' "$p" "$st" "$sec" "$res"
done | tee -a "$SUMMARY"
exit "$failed"

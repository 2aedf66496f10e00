#!/usr/bin/env bash
# GPU readiness checks and benchmarks on one GPU (sized for an H200: the whole script stays under
# 9 minutes; each part gets min(its own limit, what is left of TOTAL_S)).
#
#   bash bench/gpu.sh            # from anywhere; runs in the repository root
#   bash bench/gpu.sh --travel   # only print what must travel with it, and exit
#   PARTS=decode_step,static_cache bash bench/gpu.sh   # a rerun of some parts only
#
# 1. what must travel (wheels in .whl/), nvidia-smi, torch/CUDA and package versions;
# 2. gpu_train: the GSPO trainer end to end (components.gspo.job.train) through DeepSpeed ZeRO-2 on
#    one rank, bf16, a random-init model of SmolLM2-135M's shape built from its config (no weights
#    travel): rollouts, updates, checkpoint, final model;
# 3. static_cache (runs last): the same with mas.static_cache=true (static KV cache + torch.compile decoding), then
#    the static cache's logic on the trained policy: its greedy episodes (uncompiled) equal the dynamic
#    cache's, with the same prompt tokens reused;
# 4. bench/train_step.py --model smollm2-shape: ours vs TRL GRPOTrainer (GSPO), bf16, 4 prompts x
#    G=8 = 32 completions per step, 128 tokens, 4 optimizer steps per generation;
# 5. bench/mfu.py: DeepSpeed ZeRO-2 bf16 training MFU on a Qwen2.5-0.5B shape vs a measured matmul peak
#    (DeepSpeed config from components.gspo.engines.deepspeed_config, as in training);
# 6. bench/rollout.py --model smollm2-shape: our batched engine vs one generate per message;
# 7. bench/decode_step.py: milliseconds per decode step of 32 rows, ours (the decoder alone, with the
#    other padding mask, and through the rollout engine) vs model.generate, and the profiler's
#    per-step counts (kernel launches, synchronisations) where the two differ.
#
# Without CUDA every part runs its CPU logic check instead (tiny models, a few steps): that is
# how the script itself is tested off the GPU. Logs and summary.txt go to $OUT (when the device
# tool sets it) or /tmp/bench-gpu. Exit status: 0 when every part ran (targets missed or not),
# 1 when a part failed, timed out or was skipped for lack of time.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
T0=$SECONDS
TOTAL_S=${TOTAL_S:-540}

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
KNOWN_PARTS=",gpu_train,train_step,mfu,rollout,decode_step,static_cache,"
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
# keep its result lines
part() {
  local name=$1 limit=$2
  shift 2
  if [ -n "${PARTS:-}" ] && [[ ",$PARTS," != *",$name,"* ]]; then
    return
  fi
  local left=$((TOTAL_S - (SECONDS - T0) - 5))
  if [ "$left" -lt 20 ]; then
    failed=1
    echo "$name: SKIPPED (only ${left}s of the ${TOTAL_S}s budget left)" | tee -a "$SUMMARY"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo
  echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  if [ "$rc" -ne 0 ]; then
    failed=1
    echo "$name: FAILED (exit $rc, see $LOGS/$name.log)" >>"$SUMMARY"
  fi
  grep -E '^(bench [a-z_]+:|gpu_train:|static_cache:|checks:|mfu:|peak:|settings:|profile |ours|peer)' "$LOGS/$name.log" | sed "s/^/$name: /" >>"$SUMMARY" \
    || true
}

if [ "$DEVICE" = cuda ]; then
  # static_cache last: its torch.compile is the long pole (it ran past 110 s on the first H200 run),
  # so it gets whatever the quicker parts leave of TOTAL_S.
  part gpu_train 110 python3 bench/gpu_train.py --device cuda --model smollm2-shape --zero-stage 2 --steps 3
  part train_step 150 python3 bench/train_step.py --device cuda --model smollm2-shape \
    --questions 4 --group 8 --tokens 128 --minibatches 4 --steps 1 --repeats 1
  part mfu 70 python3 bench/mfu.py --device cuda
  # SmolLM2 shape at a size the per-message peer finishes: 48 messages x 16 tokens
  part rollout 60 python3 bench/rollout.py --device cuda --model smollm2-shape --questions 2 --group 4 --agents 3 \
    --rounds 2 --tokens 16
  part decode_step 120 python3 bench/decode_step.py --device cuda --rows 32 --prompt 128 --short 8 --long 40 \
    --profile --profile-steps 3 --mask2d --engine
  part static_cache 260 python3 bench/gpu_train.py --device cuda --model smollm2-shape --zero-stage 2 --steps 2 \
    --set mas.static_cache=true
else
  part gpu_train 120 python3 bench/gpu_train.py --device cpu --model tiny-random --steps 2 --questions 2 --group 2 \
    --rounds 1 --tokens 16
  part static_cache 120 python3 bench/gpu_train.py --device cpu --model tiny-random --steps 2 --questions 2 \
    --group 2 --rounds 1 --tokens 16 --set mas.static_cache=true
  part train_step 150 python3 bench/train_step.py --device cpu --model tiny-random --questions 2 --group 4 \
    --tokens 16 --minibatches 2 --steps 1 --repeats 1
  part rollout 60 python3 bench/rollout.py --device cpu --questions 2 --group 2 --agents 2 --rounds 1 --tokens 8
  part mfu 60 python3 bench/mfu.py --device cpu --tiny --steps 2 --warmup 1
  part decode_step 60 python3 bench/decode_step.py --device cpu --model tiny-random --rows 4 --prompt 16 --short 2 \
    --long 6 --profile --mask2d --engine --static
fi

echo
echo "== summary ($SUMMARY), $((SECONDS - T0)) s in all"
cat "$SUMMARY"
exit "$failed"

#!/usr/bin/env bash
# GPU benchmarks on one GPU (sized for an H200: under 8 minutes in all).
#
#   bash bench/gpu.sh            # from anywhere; runs in the repository root
#
# 1. nvidia-smi and the torch/CUDA versions;
# 2. bench/rollout.py --device cuda (+ --model smollm2-shape when rollout.py offers that flag);
# 3. bench/train_step.py --device cuda --model smollm2-shape: ours vs TRL GRPOTrainer (GSPO), bf16,
#    random weights of SmolLM2-135M's shape, 4 prompts x G=8 = 32 completions per step, 128 tokens,
#    4 optimizer steps per generation (the TRL GSPO reference setting);
# 4. bench/mfu.py --device cuda: DeepSpeed ZeRO-2 bf16 training MFU on a Qwen2.5-0.5B shape,
#    16 x 1024 tokens per step, against a bf16 matmul peak measured in the same run.
#
# Python packages missing on the GPU image (deepspeed, trl, datasets, pydantic, ...) may travel as
# wheels in .whl/; they are installed into /tmp/site first. Logs and a summary go to $OUT (when the
# device tool sets it) or /tmp/bench-gpu. Exit status: 0 when every part ran (targets missed or
# not), 1 when a part failed or timed out.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu.sh: installing .whl/*.whl failed" >&2; exit 1; }
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
  DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_NO_ADVISORY_WARNINGS=1
LOGS="${OUT:-/tmp/bench-gpu}"
mkdir -p "$LOGS"
SUMMARY="$LOGS/summary.txt"
: >"$SUMMARY"
failed=0

nvidia-smi || echo "gpu.sh: nvidia-smi failed"
python3 - <<'PY' || failed=1
import importlib, torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device: "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
for name in ("transformers", "trl", "datasets", "accelerate", "deepspeed", "pydantic", "tokenizers"):
    try:
        print(f"  {name} {importlib.import_module(name).__version__}")
    except Exception as exc:  # report every missing package at once, then let the parts fail
        print(f"  {name}: NOT importable ({type(exc).__name__}: {exc})")
PY

# part NAME SECONDS CMD...: run with a wall-clock limit, log to $LOGS/NAME.log, keep its result line
part() {
  local name=$1 limit=$2
  shift 2
  echo
  echo "== $name: $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  if [ "$rc" -ne 0 ]; then
    failed=1
    echo "$name: FAILED (exit $rc, see $LOGS/$name.log)" >>"$SUMMARY"
  fi
  grep -E '^(bench [a-z_]+:|mfu:|peak:|settings:)' "$LOGS/$name.log" >>"$SUMMARY" || true
}

rollout_model=()
if python3 bench/rollout.py --help 2>/dev/null | grep -q -- '--model'; then
  rollout_model=(--model smollm2-shape)
else
  echo "note: bench/rollout.py has no --model flag; it runs its tiny model on the GPU" | tee -a "$SUMMARY"
fi
part rollout 120 python3 bench/rollout.py --device cuda "${rollout_model[@]}"
part train_step 300 python3 bench/train_step.py --device cuda --model smollm2-shape \
  --questions 4 --group 8 --tokens 128 --minibatches 4 --steps 3 --repeats 2
part mfu 150 python3 bench/mfu.py --device cuda

echo
echo "== summary ($SUMMARY)"
cat "$SUMMARY"
exit "$failed"

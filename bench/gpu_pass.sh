#!/usr/bin/env bash
# One pass on a machine lent an NVIDIA GPU (about 10 minutes; docs/benchmarks.md, "On a GPU"):
#   1. the telemetry bench with its GPU-host baselines (the daemon on NVML; nvidia-smi -l 1; a
#      nvidia-smi per tick; nvitop --once per tick where installed)
#   2. the collector on both paths (NVML, nvidia-smi) against nvidia-smi's own figures, with a
#      tagged process mapped to its job and rank
#   3. the ddp example under both launchers against the same script by hand (NCCL, GPU 0)
#   4. the model-parallel example's profiling on CUDA (peak memory: max_memory_allocated)
#   5. the app's Hosts, GPU and Job views on the card while the ddp example trains (screenshots/gpu*.svg)
# Each writes bench/results/gpu-*.json with the device, driver, torch, CUDA and the commit.
# Without a usable GPU it stops at once, saying why (exit 2), and runs nothing.
#
#   bash bench/gpu_pass.sh            # everything
#   bash bench/gpu_pass.sh ddp        # some steps: telemetry collector ddp pipeline
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
"$PY" bench/gpu_pass.py check || exit 2

steps=${*:-telemetry collector ddp pipeline screens}
failed=()
for step in $steps; do
  echo "== $step ($(date -u +%H:%M:%S))"
  case $step in
    telemetry)
      # writes bench/results/telemetry-<device>.json (named by the GPU model), kept as it is
      if timeout 300 "$PY" bench/telemetry.py --skip-ingest --agent-seconds 20 --idle-seconds 5; then
        "$PY" bench/gpu_pass.py wrap telemetry "$(ls -t bench/results/telemetry-*.json | head -1)"
      else
        failed+=(telemetry)
      fi ;;
    ddp)
      # about 100 s a round (RIGDECK_GPU_PASS_ROUNDS, 2 by default) and one warm-up run
      timeout $(( 60 + 110 * ${RIGDECK_GPU_PASS_ROUNDS:-2} )) "$PY" bench/gpu_pass.py ddp || failed+=(ddp) ;;
    collector|pipeline|screens)
      timeout 400 "$PY" bench/gpu_pass.py "$step" || failed+=("$step") ;;
    *) echo "gpu_pass: unknown step $step (telemetry collector ddp pipeline screens)" >&2; exit 2 ;;
  esac
done
ls -l bench/results/gpu-*.json 2>/dev/null
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_pass: FAILED: ${failed[*]} (see above)" >&2
  exit 1
fi
echo "gpu_pass: all steps passed"

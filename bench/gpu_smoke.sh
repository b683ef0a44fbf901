#!/usr/bin/env bash
# GPU smoke test: the train flow on this machine's CUDA GPUs, offline, in at most 8 minutes.
#
#   bench/gpu_smoke.sh                 # from the repository root; PYTHON=... to pick the interpreter
#
# What runs: FSDP2 trainer ranks over nccl, the built-in engine server on CUDA, the first
# weight sync and 3 iterations (generate, train, sync with the weight check), on the
# built-in tiny model (nothing is downloaded; no package registry is needed, only a
# Python that has torch with CUDA and this project's dependencies). It prints the GPU
# layout it chose and each iteration's figures. Layouts by GPU count:
#   >= 3 GPUs: 2 trainer ranks (1 GPU each) + 1 engine on its own GPU, broadcast sync (nccl)
#      2 GPUs: 1 trainer rank + 1 engine, broadcast sync (nccl)
#      1 GPU : colocated (mode=sync), engine and rank share the GPU; disk sync, because NCCL
#              refuses two ranks of one group on the same GPU
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
LIMIT_S=${GPU_SMOKE_LIMIT_S:-480}

# Fail fast, before anything starts, on a machine without CUDA or without the dependencies.
gpus=$("$PYTHON" - <<'PY'
import importlib.util, sys
try:
    import torch
except ImportError:
    sys.exit("gpu_smoke: torch is not importable by this Python (set PYTHON=...)")
if not torch.cuda.is_available():
    sys.exit(f"gpu_smoke: no CUDA device (torch {torch.__version__}, cuda build: {torch.version.cuda}); "
             "this script needs an NVIDIA GPU")
if not torch.distributed.is_nccl_available():
    sys.exit("gpu_smoke: this torch build has no NCCL")
missing = [m for m in ("ray", "prefect", "prefect_ray", "transformers", "fastapi", "uvicorn", "httpx")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_smoke: missing packages {missing}: install the project's dependencies first")
print(torch.cuda.device_count())
PY
)

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/prl-gpu-smoke-XXXXXX")
common=(
  run_name=gpu-smoke num_rollout=3 "storage.uri=$run_dir"
  rollout.prompts_per_rollout=32 rollout.n_samples_per_prompt=8
  weight_sync.check_weight_update_equal=true
  checkpoint.save_interval=3 eval.interval=3 eval.num_prompts=16
  cluster.trainer.cpus_per_worker=1 cluster.engines.cpus_per_worker=1
)
if (( gpus >= 3 )); then
  layout=(mode=async cluster.trainer.num_workers=2 cluster.trainer.gpus_per_worker=1
          cluster.engines.gpus_per_worker=1)
elif (( gpus == 2 )); then
  layout=(mode=async cluster.trainer.num_workers=1 cluster.trainer.gpus_per_worker=1
          cluster.engines.gpus_per_worker=1)
else
  layout=(mode=sync cluster.colocate=true cluster.trainer.num_workers=1
          cluster.trainer.gpus_per_worker=1 cluster.engines.gpus_per_worker=1 weight_sync.method=disk)
fi
echo "gpu_smoke: $gpus GPU(s); layout: ${layout[*]}; run folder: $run_dir"

start=$(date +%s)
# PREFECT_API_URL empty: the flow starts its own API server on loopback (no network needed)
status=0
PREFECT_API_URL="" PREFECT_SERVER_ANALYTICS_ENABLED=false \
  timeout --kill-after=20 "$LIMIT_S" "$PYTHON" -m flows.train "${common[@]}" "${layout[@]}" || status=$?
echo "gpu_smoke: flow exited with $status after $(( $(date +%s) - start )) s (limit ${LIMIT_S} s)"
report=0
"$PYTHON" -m bench.gpu_smoke_report "$run_dir/gpu-smoke" || report=$?

SGLANG_PYTHON=${SGLANG_PYTHON:-$PYTHON}
sglang_status=0
if "$SGLANG_PYTHON" -c 'import sglang, sgl_kernel' 2>/dev/null; then
  echo "gpu_smoke: SGLang $("$SGLANG_PYTHON" -c 'import sglang; print(sglang.__version__)') on CUDA"
  start=$(date +%s)
  PREFECT_API_URL="" PREFECT_SERVER_ANALYTICS_ENABLED=false \
    timeout --kill-after=20 "$LIMIT_S" "$PYTHON" -m flows.train "${common[@]}" "${layout[@]}" \
    run_name=gpu-smoke-sglang rollout.engine=sglang "rollout.sglang_python=$SGLANG_PYTHON" \
    || sglang_status=$?
  echo "gpu_smoke: SGLang flow exited with $sglang_status after $(( $(date +%s) - start )) s"
  "$PYTHON" -m bench.gpu_smoke_report "$run_dir/gpu-smoke-sglang" || sglang_status=1
else
  echo "gpu_smoke: SGLang stage skipped: $SGLANG_PYTHON cannot import sglang and sgl_kernel"
fi
(( status == 0 && report == 0 && sglang_status == 0 ))

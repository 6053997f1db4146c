#!/usr/bin/env bash
# The device check (`make gpu-check`): tests/gpu on one CUDA GPU, its JSON report in $RLX_GPU_REPORT
# (default tests/gpu/gpu_check_<date>.json), written after every test and printed at the end.
# Sized for one H100 or H200: host copy, (a) rollout against LMDeploy's own batch inference, (b) weight
# sync, the engine-settings sweep, the training MFU sweep and (d) 3 `rlx fit` steps, in about 8 minutes;
# the sweeps shrink to fit (tests/gpu/test_gpu_check.py), and pytest is stopped at 9 minutes.
# RLX_GPU_CHECK_SELECT is pytest's -k (default "not lora and not agent": the LoRA sync and LoRA steps,
# and the agent steps, run apart: RLX_GPU_CHECK_SELECT=agent, about 2 minutes).
# Where LMDeploy is not installed (the device has no network), the wheels of `make gpu-bundle`,
# carried in .gpu-bundle/, are installed into a folder first (--no-index --no-deps); a later call on the
# same machine finds them there. Ray (the one-worker group of (d)) travels in a call of its own, with
# .gpu-bundle-ray/ (`make gpu-bundle-ray`) and RLX_GPU_CHECK_SELECT="fit_steps_with or one_worker".
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x /opt/torch/.venv/bin/python3 ] && echo /opt/torch/.venv/bin/python3 || echo python3 )}
export RLX_GPU_REPORT=${RLX_GPU_REPORT:-$PWD/tests/gpu/gpu_check_$(date +%F).json}
select=${RLX_GPU_CHECK_SELECT-not lora and not agent}
bundle=${RLX_GPU_BUNDLE:-.gpu-bundle}
target=${RLX_BUNDLE_TARGET:-${TMPDIR:-/tmp}/rlx-gpu-bundle}
if ! "$PYTHON" -c "import lmdeploy" 2>/dev/null; then
    if [ ! -d "$target/lmdeploy" ]; then
        "$PYTHON" scripts/gpu_bundle.py size "$bundle"  # missing or too big: one line, exit 2
        "$PYTHON" -m pip install --quiet --no-index --no-deps --target "$target" "$bundle"/*.whl
    fi
    export PYTHONPATH="$PWD/src:$target${PYTHONPATH:+:$PYTHONPATH}" PATH="$target/bin:$PATH"
fi
ray_bundle=${RLX_GPU_RAY_BUNDLE:-.gpu-bundle-ray}
if [ -d "$ray_bundle" ] && ! "$PYTHON" -c "import ray" 2>/dev/null; then
    "$PYTHON" scripts/gpu_bundle.py size "$ray_bundle"
    "$PYTHON" -m pip install --quiet --no-index --no-deps --target "$target-ray" "$ray_bundle"/*.whl
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$target-ray" PATH="$PATH:$target-ray/bin"
fi
"$PYTHON" -c "import torch, sys; torch.cuda.is_available() or sys.exit('error: the GPU check needs a CUDA GPU; none is visible here')" || exit 2
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
status=0
timeout 540 "$PYTHON" -m pytest tests/gpu -m gpu -s -p no:cacheprovider -o addopts="-ra" ${select:+-k "$select"} "$@" || status=$?
[ -f "$RLX_GPU_REPORT" ] && cat "$RLX_GPU_REPORT"
exit $status

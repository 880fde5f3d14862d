#!/usr/bin/env bash
# The GPU check (issue 11, item 5): agentpark's jax_memkind backend parks and restores KV
# through SessionCore on one NVIDIA GPU, and each pause and restore is divided by a plain
# pinned jax.device_put of the same bytes timed just before it (target >= 0.9x).
#
# Run it ONLY on a machine with an NVIDIA GPU (nvidia-smi and its driver). Tests and CI
# never run it: they only check its syntax and its bench command line
# (tests/bench/test_gpu_check.py). From the repository root:
#
#   bash deploy/gpu-check.sh        (or: make gpu-check)
#
# It makes a virtualenv ($VENV, default .venv-gpu) and installs agentpark with the CUDA
# build of jax, jax[cuda12]==$JAX_VERSION (below): the slow part, gigabytes of CUDA wheels (cuDNN,
# cuBLAS, ...) from PyPI, minutes on a fresh host (seconds from pip's cache). Then it prints
# the GPU and the bench's tables; the whole run fits in ~8 minutes (the install and the
# bench each have a timeout). The output also goes to $OUT/gpu-check.log when $OUT is set.
#
# Hosts without PyPI whose python3 already has a CUDA jax (the image of this project's lent
# GPU machines has one): set WHEELS=DIR (relative to the repository root, e.g. .whl), a
# folder of wheels of agentpark's other dependencies, downloaded where PyPI is reachable;
# they and agentpark go into $VENV/site for the host's python3 and its jax, whatever its
# version (the bench's notes print it). Neither path has run yet: no GPU was lent.
set -euo pipefail
cd "$(dirname "$0")/.."

# The CUDA build of the jax release the project's CPU suite runs (.venv, made by make
# test), so GPU and CPU figures come from one release; unpinned without a .venv.
JAX_VERSION=${JAX_VERSION:-$(.venv/bin/python -c 'import jax; print(jax.__version__)' 2>/dev/null || true)}
VENV=${VENV:-.venv-gpu}
INSTALL_TIMEOUT=${INSTALL_TIMEOUT:-330}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-150}

check() {
    if ! command -v nvidia-smi >/dev/null; then
        echo "gpu-check: no nvidia-smi: not a GPU host"
        return 2
    fi
    echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"

    echo "installing agentpark and a CUDA jax (the slow part)..."
    local py
    if [ -n "${WHEELS:-}" ]; then  # offline: the host's python3 and jax, the rest from $WHEELS
        py=python3
        PYTHONPATH="$(realpath -m "$VENV")/site"
        export PYTHONPATH
        local pip_target=(-m pip install --quiet --no-index --no-deps --target "$PYTHONPATH")
        timeout "$INSTALL_TIMEOUT" python3 "${pip_target[@]}" "$WHEELS"/*.whl
        timeout "$INSTALL_TIMEOUT" python3 "${pip_target[@]}" --no-build-isolation .
    else
        python3 -m venv "$VENV"
        py="$VENV/bin/python"
        timeout "$INSTALL_TIMEOUT" "$py" -m pip install --quiet -e . "jax[cuda12]${JAX_VERSION:+==$JAX_VERSION}"
    fi

    export JAX_PLATFORMS=cuda  # fail rather than fall back to the CPU
    "$py" -c 'import jax; print("jax", jax.__version__, jax.devices())'
    timeout "$BENCH_TIMEOUT" "$py" -m agentpark bench transfer --backend jax_memkind \
        --sizes 256MiB,1GiB --repeats 5
}

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    check 2>&1 | tee "$OUT/gpu-check.log"
else
    check
fi

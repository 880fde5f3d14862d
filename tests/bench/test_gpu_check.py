"""deploy/gpu-check.sh, the GPU check: never run here (no GPU, no CUDA wheel may be
installed), only checked: it parses as bash, installs the CUDA build of the jax the
project's .venv runs, and its bench command line is one the real CLI accepts."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from agentpark import cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "gpu-check.sh"


def _text() -> str:
    return SCRIPT.read_text()


def test_the_script_parses_as_bash() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert _text().startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in _text()


def test_the_script_says_it_is_for_gpu_hosts_only() -> None:
    header = "".join(line for line in _text().splitlines(keepends=True) if line.startswith("#"))
    assert "ONLY on a machine with an NVIDIA GPU" in header
    assert "never run it" in header and "the slow part" in header


def test_the_script_installs_the_cuda_build_of_the_jax_the_project_runs() -> None:
    """No release is written into the script (it would go stale as PyPI moves on): it asks
    the project's own .venv which jax it runs, and installs the CUDA build of that one."""
    text = _text()
    assert not re.search(r"^JAX_VERSION=[0-9]", text, flags=re.MULTILINE)
    assert (
        "JAX_VERSION=${JAX_VERSION:-$(.venv/bin/python -c 'import jax; print(jax.__version__)'"
        in text
    )
    assert '"jax[cuda12]${JAX_VERSION:+==$JAX_VERSION}"' in text
    bash = shutil.which("bash")
    assert bash is not None
    # The expansion as bash does it: pinned when a version is known, plain otherwise.
    for version, want in (("0.10.2", "jax[cuda12]==0.10.2"), ("", "jax[cuda12]")):
        done = subprocess.run(
            [
                bash,
                "-c",
                'JAX_VERSION="$1"; echo "jax[cuda12]${JAX_VERSION:+==$JAX_VERSION}"',
                "_",
                version,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip() == want


def test_the_bench_command_is_one_the_cli_accepts() -> None:
    text = _text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if "bench transfer" in ln]
    argv = shlex.split(line)
    argv = argv[argv.index("bench") :]
    args = cli.parse_args(cli.build_parser(), argv)
    assert args.backend == "jax_memkind" and args.tier == "dram"
    assert args.sizes == "256MiB,1GiB" and args.repeats == 5
    assert "timeout" in line  # never hangs the lent machine
    assert "JAX_PLATFORMS=cuda" in _text()  # never measures the CPU by mistake


def test_make_gpu_check_runs_the_script() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "\ngpu-check:\n\tbash deploy/gpu-check.sh\n" in makefile
    # Not part of the suite: `make test` never reaches it.
    test_recipe = makefile.split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    assert "gpu-check" not in test_recipe

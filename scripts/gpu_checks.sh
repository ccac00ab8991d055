#!/usr/bin/env bash
# Everything worth checking on a GPU machine lent for a few minutes, in one run:
#
#     OUT=/some/folder bash scripts/gpu_checks.sh
#     OUT=/some/folder STEPS="machine pytest-gpu fp8" bash scripts/gpu_checks.sh   # some steps only
#
# The machine is expected to have python3 with torch (CUDA), numpy, typer, rich, pytest,
# pytest-xdist and regex, but no internet: anything else minitron imports (debugpy) comes as
# wheels in the checkout's git-ignored .whl/ folder, installed into a scratch folder here.
# minitron runs from the checkout (PYTHONPATH), not installed.
#
# Each step has its own time limit, so the whole stays within about 8 minutes; a step that
# fails or runs out of time is recorded and the next one runs. Every step's output lands in
# $OUT/<step>.log, and $OUT/summary.txt has one line per step: its name, exit code, seconds.
# The benchmark comes first: it is the figure the machine is lent for.

set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
: > "$OUT/summary.txt"

SITE=$(mktemp -d)
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl > "$OUT/wheels.log" 2>&1
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

# The steps, in order (STEPS picks some: device time is short, and a rerun checks one thing).
STEPS=${STEPS:-machine bench pytest-gpu fp8 bench-fp8 readme-gpu torchrun}

# step NAME SECONDS COMMAND...: run it under a time limit, its output in $OUT/NAME.log.
step() {
    local name=$1 limit=$2 started=$SECONDS rc
    shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    timeout --kill-after=15 "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    [ $rc -eq 124 ] && echo "(stopped after $limit s)" >> "$OUT/$name.log"
    printf '%-16s exit %3d  %4d s\n' "$name" "$rc" $((SECONDS - started)) | tee -a "$OUT/summary.txt"
}

step machine 20 bash -c 'nvidia-smi; python3 -c "import torch, sys; print(sys.version); print(torch.__version__, \
torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.device_count(), torch.cuda.get_device_name())"'

step bench 170 python3 scripts/bench_gpu.py --iters 8 --json "$OUT/bench.json"

# The test files that hold tests marked gpu: collecting the whole suite would need the dev
# extra's packages (mkdocs, hypothesis), which this machine lacks.
# Each test's outcome is written as it ends (-rA, unbuffered) and into a JUnit file, and a test
# that runs past 180 s is stopped with its stack (pytest-timeout, where installed): a step cut
# off by its limit still says which tests passed and which were still running. (On 2026-11-27
# the 20 tests ran past 180 s on 12 workers of an H100 and a buffered log could not say which;
# the project's addopts carry -q, which cancels -v, so they are replaced here.)
mapfile -t GPU_TESTS < <(grep -l "mark.gpu" tests/test_*.py)
PER_TEST=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout 180")
step pytest-gpu 220 env PYTHONUNBUFFERED=1 python3 -m pytest -o addopts= -p no:cacheprovider -p no:benchmark -n 8 -v -rA \
    --junitxml "$OUT/pytest-gpu.xml" $PER_TEST -m gpu "${GPU_TESTS[@]}"

# fp8 (issue 37): torch._scaled_mm against the dequantized fp32 product, then the benchmark's
# model trained in bf16 and with fp8 GEMMs (tensorwise recipe), 6 iterations each.
step fp8 45 python3 scripts/check_fp8_gpu.py --json "$OUT/fp8_gemm.json"
step bench-fp8 130 python3 scripts/bench_gpu.py --iters 6 --fp8 tensorwise --json "$OUT/bench_fp8.json"

# The README's one-machine commands (the first bash block of its "On GPUs" section), as they
# are written there, and its GPT=... flags alone; `minitron` is the checkout's, through python3 -m.
python3 - "$OUT" <<'EOF'
import re, sys
text = open("README.md", encoding="utf-8").read()
section = text[text.index("## On GPUs\n"):]
block = re.search(r"```bash\n(.*?)\n```", section[: section.index("\n## ", 1)], re.S).group(1)
open(f"{sys.argv[1]}/readme_gpu_commands.sh", "w").write(block + "\n")
open(f"{sys.argv[1]}/readme_gpt_flags.sh", "w").write(block[: block.index("\nminitron ")] + "\n")
EOF
step readme-gpu 45 bash -c 'minitron() { python3 -m minitron "$@"; }; set -e; source "$0"' \
    "$OUT/readme_gpu_commands.sh"

# The README's torchrun command on this one node: --nnodes 1, every GPU here, no tensor parallelism.
step torchrun 45 bash -c 'source "$0"; torchrun --nnodes 1 --node-rank 0 \
    --nproc-per-node "$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)" \
    --master-addr 127.0.0.1 --master-port 29500 -m minitron.pretrain_gpt $GPT --distributed-backend nccl' \
    "$OUT/readme_gpt_flags.sh"

echo "results in $OUT"

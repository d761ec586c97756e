#!/usr/bin/env bash
# The 16-core scaling run (issue "many cores") and the agent loop (issue "agent loops"), prepared for the lent measurement machine.
#
# That machine is bare but for Python 3.12 with numpy, numba, joblib, tiktoken and pytest, and it
# reaches no network: the wheels it lacks travel with the working tree in .whl/ (git-ignored).
#
#   bench/device_scaling.sh prepare     # here: download the wheels it lacks into .whl/
#   # then, with the device tool: run(command="bench/device_scaling.sh run", carry=[".whl"], timeout_s=540)
#
# "run" installs the wheels and kimi_tok into /tmp/site, checks ids against tiktoken on the way
# (bench.scaling does, every round), and leaves the table, the JSON and the plot in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(pcre2==0.7.1 basetenkenizer==0.2.8)

case "${1:-}" in
prepare)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
    for wheel in "${WHEELS[@]}"; do
        python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d .whl "$wheel"
    done
    ls -l .whl
    ;;
run)
    : "${OUT:?run this on the measurement machine, where OUT is set}"
    export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NUMBA_CACHE_DIR=/tmp/numba-cache
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    nproc
    # ../shared does not travel: the tiktoken reference reads the package's own (identical) copy
    export KIMI_K3_DIR=/tmp/kimi-k3
    python3 - <<'PY'
import gzip, json, os
from pathlib import Path
import kimi_tok
from importlib.resources import files
out = Path(os.environ["KIMI_K3_DIR"]); out.mkdir(parents=True, exist_ok=True)
data = files("kimi_tok") / "data"
(out / "tiktoken.model").write_bytes(gzip.decompress((data / "kimi_k3.tiktoken.gz").read_bytes()))
(out / "special_tokens.json").write_bytes((data / "kimi_k3_special_tokens.json").read_bytes())
(out / "pattern.txt").write_text(kimi_tok.KIMI_PATTERN, encoding="utf-8")
kimi_tok.kimi_k3().encode("warm up the numba cache")
PY
    python3 -m bench.scaling --sizes 100k,1M --workers 1,2,4,8,16 --rounds 5 --markdown \
        --json "$OUT/scaling_16core.json" --plot "$OUT/scaling_16core.png" 2>&1 | tee "$OUT/scaling_16core.txt"
    RAYON_NUM_THREADS=1 python3 -m bench.scaling --sizes 1M --workers 1 --backends threads --rounds 5 \
        --baselines basetenkenizer 2>&1 | tee "$OUT/basetenkenizer_one_thread.txt"
    # the headline on real text, kimi_tok and basetenkenizer side by side (tiktoken, the reference, runs too)
    python3 -m bench.bench --peers basetenkenizer --rounds 7 --results-dir "$OUT" 2>&1 \
        | tee "$OUT/headline_16core.txt"
    # issue "agent loops": the last-turn ratio to basetenkenizer on this machine (~15 s a run), and where it goes
    python3 -m bench.agent_loop --encoders basetenkenizer --markdown --json "$OUT/agent_loop_16core.json" \
        --plot "$OUT/agent_loop_16core.png" 2>&1 | tail -45 | tee "$OUT/agent_loop_16core.txt"
    python3 -m bench.agent_loop --no-plot --quiet 2>&1 | tail -9 | tee -a "$OUT/agent_loop_16core.txt"
    python3 -m bench.turn_timeline 2>&1 | tee -a "$OUT/agent_loop_16core.txt"
    ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac

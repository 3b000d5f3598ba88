#!/usr/bin/env bash
# Download the wheels of scripts/gpu_wheels.txt for Python 3.12 on manylinux x86_64 into .whl/
# (ignored by git), for a GPU machine with no network; print their sizes and the total, which
# must stay under the 64 MiB a device call carries. docs/gpu_benchmark.md has the command
# that installs them there.
#   bash scripts/fetch_gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT=$((64 * 1024 * 1024))
TARGET=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

# Two versions of one package stop the install on the GPU machine: start from an empty folder.
rm -f .whl/*.whl
mkdir -p .whl
grep -v '^\s*\(#\|$\)' scripts/gpu_wheels.txt | while read -r pin; do
    if ! python3 -m pip download -q --no-deps --only-binary=:all: "${TARGET[@]}" -d .whl "$pin" 2>/dev/null; then
        # Some pure-Python packages publish only a source archive (antlr4-python3-runtime 4.9.3):
        # build the wheel here; a pure-Python wheel (py3-none-any) installs on any Python 3.
        echo "no wheel on the index for $pin: building it" >&2
        python3 -m pip wheel -q --no-deps -w .whl "$pin"
    fi
done

impure=$(ls .whl/*.whl | grep -v -e '-none-any\.whl$' -e 'cp312' -e '-abi3-' || true)
if [ -n "$impure" ]; then
    echo "error: built for this machine's Python, not 3.12 on x86_64: $impure" >&2
    exit 1
fi
ls -l .whl/*.whl | awk '{ printf "%10d  %s\n", $5, $9 }'
total=$(cat .whl/*.whl | wc -c)
echo "total: $total bytes ($(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }') MiB) in $(ls .whl/*.whl | wc -l) wheels"
if [ "$total" -gt "$LIMIT" ]; then
    echo "error: over the 64 MiB a device call carries" >&2
    exit 1
fi

#!/usr/bin/env bash
# The travel kit for a borrowed GPU machine (no package index there; README "On a GPU"), made on a machine with pip:
#   .whl/          the wheels fedbench needs that the GPU image lacks (hydra-core, omegaconf, antlr4-python3-runtime:
#                  pure Python, one version each, the versions installed here), for Python 3.12 / manylinux x86-64
#                  --peers adds pfl-research and the pure-Python packages it imports that the image lacks
#                  (scripts/device_kit.py PEERS, 0.8 MiB), for scripts/peers/pfl_cifar10.py --device cuda
#   .device-data/  ../shared/data packed small: cifar10.tar.gz (the JPEG tree) and MNIST/raw/*.gz (skip: --no-data)
# Both are git-ignored; the device call carries them (carry: [".whl", ".device-data"], and ".device-runs": the runs
# earlier calls brought back unfinished, scripts/device_pack.py; the size check below counts all three). Skips what is
# already there.
#   bash scripts/device_prep.sh [--no-data] [--peers]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
NO_DATA=; PEERS=
for a in "$@"; do
    case "$a" in
        --no-data) NO_DATA=1 ;;
        --peers) PEERS=peers ;;
        *) echo "device_prep.sh: unknown option $a (allowed: --no-data, --peers)" >&2; exit 2 ;;
    esac
done
read -r -a PINS <<< "$("$PY" scripts/device_kit.py pins $PEERS)"
mkdir -p .whl
for pin in "${PINS[@]}"; do
    name=${pin%%==*}; version=${pin##*==}
    stem=$(echo "$name" | tr '-' '_')
    if ls .whl/"${stem}"-"${version}"-*.whl >/dev/null 2>&1; then continue; fi
    # a wheel for the GPU machine's Python; antlr4-python3-runtime 4.9.3 is published as an sdist only, so it is built
    # here (pure Python: the wheel is py3-none-any, the same file for 3.11 and 3.12)
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .whl "$pin" 2>/dev/null \
        || "$PY" -m pip wheel -q --no-deps -w .whl "$pin"
done
ls .whl/*.whl | grep -v -E -e "-none-any\.whl$" && { echo "device_prep: a kit wheel is not pure Python" >&2; exit 1; }
if [ -z "$NO_DATA" ]; then
    "$PY" scripts/device_kit.py data .device-data
fi
du -sh .whl .device-data 2>/dev/null || true
"$PY" scripts/device_kit.py size .whl $( [ -d .device-data ] && echo .device-data ) $( [ -d .device-runs ] && echo .device-runs )

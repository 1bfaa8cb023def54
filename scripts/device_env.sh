# Sourced by scripts/gpu_check.sh and scripts/device_run.sh on a machine without a package index (the device tool's
# GPU image): the travel kit's wheels (.whl/, scripts/device_prep.sh) unzipped onto PYTHONPATH when hydra is missing,
# and the data carried in .device-data/ unpacked into a temporary $FEDBENCH_DATA (else ../shared/data if present).
# Expects $PY; sets PYTHONPATH and FEDBENCH_DATA; the temporary dirs go when the calling shell exits.
if ! "$PY" -c "import hydra, omegaconf" 2>/dev/null; then   # the travel kit: pure-Python wheels, unzipped
    WHL=${FEDBENCH_KIT:-.whl}
    ls "$WHL"/*.whl >/dev/null 2>&1 || { echo "device_env.sh: hydra is missing and $WHL/ has no wheels (run bash scripts/device_prep.sh where pip works)"; return 3; }
    KIT=$(mktemp -d); trap 'rm -rf "$KIT" "${UNPACKED:-}"' EXIT
    for w in "$WHL"/*.whl; do "$PY" -m zipfile -e "$w" "$KIT" || return 3; done
    export PYTHONPATH="$PYTHONPATH:$KIT"
    echo "device_env.sh: the travel kit from $WHL/: $(cd "$WHL" && ls *.whl | tr '\n' ' ')"
fi
if [ -z "${FEDBENCH_DATA:-}" ] && [ -f .device-data/cifar10.tar.gz ]; then   # the data carried with the tree
    FEDBENCH_DATA=$(mktemp -d); UNPACKED=$FEDBENCH_DATA; trap 'rm -rf "${KIT:-}" "$UNPACKED"' EXIT
    tar xzf .device-data/cifar10.tar.gz -C "$FEDBENCH_DATA" || return 3
    mkdir -p "$FEDBENCH_DATA/MNIST/raw"
    for f in .device-data/MNIST/raw/*.gz; do [ -f "$f" ] && gunzip -c "$f" > "$FEDBENCH_DATA/MNIST/raw/$(basename "${f%.gz}")"; done
    export FEDBENCH_DATA
    echo "device_env.sh: data unpacked from .device-data/ into $FEDBENCH_DATA ($(find "$FEDBENCH_DATA" -type f | wc -l) files)"
elif [ -z "${FEDBENCH_DATA:-}" ] && [ -d ../shared/data/cifar10 ]; then
    export FEDBENCH_DATA=$(cd ../shared/data && pwd)
fi

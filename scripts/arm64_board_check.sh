#!/usr/bin/env bash
# The board-side boundary on the board's architecture: the driver, devices, runtime, scheduler policies and
# `fluidnpu serve` tested on an aarch64 Python in a Debian 12 arm64 root run under qemu-user, with only the
# board-side dependencies installed (docs/deploy.md, "The board-side code on arm64").
#
#     sudo scripts/arm64_board_check.sh          # or: make arm64-check
#
# Needs root (apt-get, binfmt_misc, debootstrap, chroot) and the Debian archive. The root is kept in
# build/arm64-root and reused; the aarch64 wheels are downloaded on this machine into build/arm64-wheels (pip
# inside the root reaches no package index) and installed there with --no-index. Logs go to build/logs/arm64-*;
# the figures to docs/figures/arm64/board_check.json (or $ARM64_CHECK_OUT), pasted into docs/deploy.md. Not part
# of `make test`: about 13 minutes on 2 cores, 4 of them building the root the first time.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$REPO/build
ROOTFS=${ARM64_ROOT:-$BUILD/arm64-root}
WHEELS=$BUILD/arm64-wheels
LOGS=$BUILD/logs
OUT=${ARM64_CHECK_OUT:-$REPO/docs/figures/arm64/board_check.json}   # the figures docs/deploy.md quotes
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
HOST_PY=${HOST_PY:-$REPO/.venv/bin/python}
CHECK=/opt/fluidnpu-check   # the tests and the check's inputs, inside the root
VENV=/opt/fluidnpu          # the board's Python environment, inside the root

# The board-side tests. Left out: tests whose subject is host-side (DSE, RTL, testbenches, the GPU path, the fleet)
# and, from test_serve.py, the docs example that compares against scikit-learn's raw images read on the host.
TESTS=(tests/test_host_driver.py tests/test_devmem_device.py tests/test_pynq_device.py tests/test_runtime.py
       tests/test_scheduler.py tests/test_scheduler_properties.py tests/test_serve.py)
DESELECT=(tests/test_serve.py::test_docs_example_accuracy_equals_run)
# The board's extras: the core (numpy, click, rich, fastjsonschema) and `serve`; `digits` only for the data set
# the served example network is calibrated and tested on (fluidnpu ships its weights, not the images).
EXTRAS="serve,digits"
PIP_PLATFORM=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311
              --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 --platform manylinux_2_34_aarch64)

die() { echo "arm64-check: $*" >&2; exit 2; }
step() { echo "arm64-check: $*"; }
in_root() { chroot "$ROOTFS" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=$VENV/bin:/usr/bin:/bin "$@"; }

[ "$(id -u)" = 0 ] || die "needs root (apt-get, binfmt_misc, debootstrap, chroot): run it with sudo"
[ -x "$HOST_PY" ] || die "no host Python at $HOST_PY (make the venv first, or set HOST_PY)"
mkdir -p "$LOGS" "$WHEELS"

# 1. the tools
if ! command -v debootstrap >/dev/null || ! command -v qemu-aarch64-static >/dev/null \
        || ! command -v update-binfmts >/dev/null; then
    step "installing debootstrap, qemu-user-static, binfmt-support (log: build/logs/arm64-apt.log)"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap qemu-user-static \
        binfmt-support; } >"$LOGS/arm64-apt.log" 2>&1 || die "apt-get failed: see $LOGS/arm64-apt.log"
fi

# 2. aarch64 binaries run through qemu: binfmt_misc mounted, the handler enabled with the F flag (the kernel
# opens the interpreter at registration, so the chroot needs no copy of it)
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || die "cannot mount binfmt_misc"
fi
update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null || die "the qemu-aarch64 binfmt handler is not enabled"
grep -q '^flags:.*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 || die "the qemu-aarch64 binfmt handler lacks the F flag"

# 3. the Debian 12 arm64 root, reused once built; mounts undone however the script ends
cleanup() {
    for m in dev/pts dev proc; do
        mountpoint -q "$ROOTFS/$m" && umount -l "$ROOTFS/$m" || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup
if [ ! -f "$ROOTFS/.debootstrap-done" ]; then
    step "building the Debian 12 arm64 root in ${ROOTFS#"$REPO"/} (about 5-10 min; log: build/logs/arm64-debootstrap.log)"
    rm -rf --one-file-system "$ROOTFS"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv bookworm "$ROOTFS" "$MIRROR" \
        >"$LOGS/arm64-debootstrap.log" 2>&1 || die "debootstrap failed: see $LOGS/arm64-debootstrap.log"
    touch "$ROOTFS/.debootstrap-done"
fi
[ "$(in_root /usr/bin/uname -m)" = aarch64 ] || die "the root does not run as aarch64"

# 4. the wheels, on this machine: fluidnpu from the worktree, its board-side dependencies for aarch64
step "downloading the aarch64 wheels (log: build/logs/arm64-wheels.log)"
rm -f "$WHEELS"/fluidnpu-*.whl
{ "$HOST_PY" -m pip wheel -q --no-deps -w "$WHEELS" "$REPO" &&
  "$HOST_PY" -m pip download -q "${PIP_PLATFORM[@]}" -d "$WHEELS" \
      "$(ls "$WHEELS"/fluidnpu-*.whl)[$EXTRAS]" pytest hypothesis; } >"$LOGS/arm64-wheels.log" 2>&1 \
    || die "building or downloading the wheels failed: see $LOGS/arm64-wheels.log"

# 5. the scheduler's input for the decision cost: FluidB's design for ResNet-50 on ZC706 at Bmax 8, as
# benchmarks/bench_scheduler.py uses it; searched here (the DSE runs on the host, the board loads the bundle)
step "the ResNet-50/ZC706 design bundle for the decision cost (host DSE)"
"$HOST_PY" - "$BUILD/arm64-check-design.json" "$BUILD/dse-cache" <<'EOF' >"$LOGS/arm64-design.log" 2>&1 \
    || die "the host DSE failed: see $LOGS/arm64-design.log"
import json, sys
from pathlib import Path
from fluidnpu.boards import load_board
from fluidnpu.scheduler_fw.designs import design_for
from fluidnpu.scheduler_fw.registry import FLUID
from fluidnpu.zoo import zoo_model
bundle, _ = design_for(zoo_model("resnet50"), load_board("zc706"), FLUID, 8, Path(sys.argv[2]))
Path(sys.argv[1]).write_text(json.dumps(bundle.data, indent=1) + "\n")
EOF

# 6. the root's Python environment: only the wheels, no index
step "installing fluidnpu[$EXTRAS] into the root's Python (log: build/logs/arm64-install.log)"
rm -rf "$ROOTFS/tmp/wheels" "$ROOTFS$CHECK"
mkdir -p "$ROOTFS$CHECK/benchmarks" "$ROOTFS$CHECK/scripts"
cp -r "$WHEELS" "$ROOTFS/tmp/wheels"
cp -r "$REPO/tests" "$REPO/pyproject.toml" "$ROOTFS$CHECK/"
cp "$REPO/benchmarks/bench_scheduler.py" "$ROOTFS$CHECK/benchmarks/"
cp "$REPO/scripts/arm64_board_check.py" "$ROOTFS$CHECK/scripts/"
cp "$BUILD/arm64-check-design.json" "$ROOTFS$CHECK/design.json"
wheel=/tmp/wheels/$(basename "$(ls "$WHEELS"/fluidnpu-*.whl)")
{ [ -x "$ROOTFS$VENV/bin/python" ] || in_root /usr/bin/python3 -m venv "$VENV"
  in_root python -m pip install -q --no-index --find-links /tmp/wheels "$wheel[$EXTRAS]" pytest hypothesis &&
  in_root python -m pip install -q --no-index --no-deps --force-reinstall "$wheel"; } >"$LOGS/arm64-install.log" 2>&1 \
    || die "installing into the root failed: see $LOGS/arm64-install.log"
rm -rf "$ROOTFS/tmp/wheels"

# 7. the tests and the decision cost, on the aarch64 Python
mount -t proc proc "$ROOTFS/proc"
mount --bind /dev "$ROOTFS/dev"
mount --bind /dev/pts "$ROOTFS/dev/pts"
deselect=()
for t in "${DESELECT[@]}"; do deselect+=(--deselect "$t"); done
step "running ${#TESTS[@]} test files under qemu-aarch64 (log: build/logs/arm64-pytest.log)"
TIMEFORMAT='%R %U %S'
set +e
{ time in_root /bin/sh -c "cd $CHECK && exec python -m pytest -q -p no:cacheprovider --junitxml=$CHECK/junit.xml \
    ${TESTS[*]} ${deselect[*]}" >"$LOGS/arm64-pytest.log" 2>&1; } 2>"$LOGS/arm64-pytest.time"
rc=$?
set -e
read -r wall user sys <"$LOGS/arm64-pytest.time"
tail -n 3 "$LOGS/arm64-pytest.log"
step "board-side imports and the decision cost, on this machine and under qemu-aarch64"
"$HOST_PY" "$REPO/scripts/arm64_board_check.py" --design "$BUILD/arm64-check-design.json" --where "(host)" \
    >"$ROOTFS$CHECK/host.json" || die "the host's decision cost failed"
mkdir -p "$(dirname "$OUT")"
in_root /bin/sh -c "cd $CHECK && exec python scripts/arm64_board_check.py --design design.json --host host.json \
    --where 'under qemu-user' --junit junit.xml --pytest-rc $rc --pytest-times $wall $user $sys" >"$OUT.tmp" \
    || die "the in-root check failed: see $OUT.tmp"
mv "$OUT.tmp" "$OUT"
if [ -n "${ARM64_CHECK_OUT:-}" ]; then   # figures kept elsewhere leave docs/deploy.md as it is
    "$HOST_PY" "$REPO/scripts/arm64_board_check.py" --summary "$OUT"
else
    "$HOST_PY" "$REPO/scripts/arm64_board_check.py" --summary "$OUT" \
        --markdown "${OUT%.json}.md" "$REPO/docs/deploy.md"
fi
[ "$rc" = 0 ] || { echo "arm64-check: the tests failed under qemu-aarch64: see $LOGS/arm64-pytest.log" >&2; exit 1; }

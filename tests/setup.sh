#!/usr/bin/env bash
# Installs what the test suite uses, idempotently: Debian packages, Python packages, the Pulsar
# broker's jars (cached in ~/.m2 and ~/.cache/rigd-pulsar). Safe to run again; fast when done.
set -euo pipefail
cd "$(dirname "$0")/.."

# What building rigd needs (`tests/setup.sh --build-deps` installs only these: README's first command).
# g++ builds OpenH264 (the `h264` feature, docs/DRIVERS.md "H.264"); nasm gives it its x86 assembly.
BUILD_PKGS=(protobuf-compiler pkg-config libasound2-dev libclang-dev g++ nasm)
APT_PKGS=("${BUILD_PKGS[@]}" socat curl ca-certificates openjdk-17-jre-headless maven linuxptp iproute2 chromium systemd)
# The camera VM test (tests/vm/camera.sh): QEMU, a static busybox and cpio for the initramfs, kmod
# for depmod/modprobe on the unpacked kernel package.
APT_PKGS+=(qemu-system-x86 busybox-static cpio kmod)
# The vehicle-in-a-box test (tests/vm/vehicle.sh): debootstrap for the cached guest, mkfs.ext4 -d for
# its disk image without loop mounts (e2fsprogs), qemu-img to inspect that image (qemu-utils).
APT_PKGS+=(debootstrap qemu-utils e2fsprogs)
# libturbojpeg's YUV-plane encoder for raw camera frames (opened at run time, not needed to build;
# the camera tests and tests/bench/jpeg.sh compare it with the built-in encoder).
APT_PKGS+=(libturbojpeg0)
# ffmpeg (with libx264): the video benchmark's decoder, SSIM and anchor (tests/bench/video.sh).
APT_PKGS+=(ffmpeg)
[ "${1:-}" = "--build-deps" ] && APT_PKGS=("${BUILD_PKGS[@]}")
# `--cross arm64`: what the arm64 .deb's cross build and the aarch64 vehicle guest need, alone
# (docs/SYSTEMD.md, "The Debian package"): Debian's cross compiler, the arm64 multiarch ALSA dev
# package, Rust's aarch64 target, QEMU's aarch64 system emulator and qemu-user with its binfmt
# handler (chroot into the arm64 guest's tree while it is prepared).
if [ "${1:-}" = "--cross" ]; then
  [ "${2:-}" = arm64 ] || { echo "setup: --cross arm64 (the one cross target)" >&2; exit 2; }
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
  CROSS_PKGS=(gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross linux-libc-dev-arm64-cross libasound2-dev:arm64
              qemu-system-arm qemu-user-static debootstrap qemu-utils e2fsprogs socat curl "${BUILD_PKGS[@]}")
  missing=()
  for p in "${CROSS_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
  rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu >&2
  # The binfmt handler (qemu-user-static's /usr/lib/binfmt.d/qemu-aarch64.conf, flag F: the
  # interpreter is opened now, so it works inside a chroot); systemd-binfmt registers it at boot,
  # here it is registered when missing (a container, a machine not rebooted since the install).
  if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    [ -e /proc/sys/fs/binfmt_misc/register ] || $SUDO mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    $SUDO sh -c 'cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register'
  fi
  exit 0
fi
missing=()
# Node.js runs the browser test's driver (playwright-core, tests/web); any node >= 20 will do.
[ "${1:-}" = "--build-deps" ] || command -v node >/dev/null || APT_PKGS+=(nodejs npm)
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

[ "${1:-}" = "--build-deps" ] && exit 0

# pytest-xdist: the parallel workers of tests/lanes.py. mcap-protobuf-support decodes the MCAP
# export's protobuf messages, pynmea2 is the NMEA reference, foxglove-schemas-protobuf Foxglove's
# own descriptors (tests/e2e/test_mcap.py); av (PyAV, FFmpeg's decoder) and numpy judge H.264
# (tests/e2e/test_video.py); cantools decodes CAN frames with a DBC and python-can reads candump
# logs (tests/e2e/test_can_decode.py).
PY_PKGS=("pulsar-client>=3.5,<4" "pillow" "pytest" "pytest-xdist" "prometheus_client" "mcap"
         "mcap-protobuf-support" "pynmea2" "foxglove-schemas-protobuf" "av>=12" "numpy"
         "cantools>=40" "python-can>=4.3")
if ! python3 -c 'import pulsar, PIL, pytest, xdist, prometheus_client, mcap, mcap_protobuf, pynmea2, foxglove_schemas_protobuf, av, numpy, cantools, can' 2>/dev/null; then
  echo "setup: installing Python packages: ${PY_PKGS[*]}" >&2
  python3 -m pip install -q "${PY_PKGS[@]}" >&2
fi

# The browser test drives Debian's chromium with playwright-core (no browser download): npm ci from
# tests/web/package-lock.json into tests/web/node_modules.
if ! npm ls --prefix tests/web >/dev/null 2>&1; then
  echo "setup: installing tests/web node modules (playwright-core)" >&2
  npm ci --prefix tests/web --no-audit --no-fund >&2
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi

# cargo-deb builds the Debian package (tests/e2e/test_systemd.py); cached in ~/.cargo/bin.
if ! command -v cargo-deb >/dev/null && [ ! -x "$HOME/.cargo/bin/cargo-deb" ]; then
  echo "setup: installing cargo-deb" >&2
  cargo install cargo-deb --locked --version 3.8.0 >&2
fi

# The broker's jars: resolved once from Maven Central, then cached; both LTS lines of the version
# matrix (tests/run.sh: 3.0.x by default, then 4.0.x).
tests/pulsar/broker.sh fetch >&2
PULSAR_VERSION=${RIGD_MATRIX_VERSION:-4.0.7} tests/pulsar/broker.sh fetch >&2

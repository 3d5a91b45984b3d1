#!/usr/bin/env bash
# Installs the device compilers that the kernel compile tests use, on a CPU-only machine:
#   - NVRTC 13.0.88 (the compiler kernels/ptx-digests.txt was recorded with) from PyPI's
#     `nvidia-cuda-nvrtc` wheel into .ci-deps/nvrtc (its lib directory
#     goes on LD_LIBRARY_PATH), for backends/cuda's NVRTC path (sm_80, sm_90, sm_100);
#   - NCCL 2.32.6's headers (nccl.h, nccl_device/*.h) from PyPI's `nvidia-nccl-cu13` wheel into
#     .ci-deps/nccl (only `nvidia/nccl/include` is unpacked), for nccl/tests/abi_232.rs, which
#     fails on any function they declare that libmscclpp_nccl.so does not export;
#   - Debian's HIP 5.2 packages (hipcc, the runtime that holds hipRTC, its builtins, the device
#     libraries), for backends/rocm's hipRTC path and the hipcc check (gfx90a, gfx908).
# Then requires them: with MSCCLPP_REQUIRE_{NVRTC,HIPRTC,HIPCC,NCCL_HEADERS}=1 those tests fail
# instead of printing "skipped: ...".
#
# SOURCE it (`source ci/install-toolchains.sh`, as .ci/run does) so that the exported variables
# reach `cargo test --workspace`. Idempotent: what is already installed is not fetched again.

_mscclpp_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_mscclpp_sudo=""
if [ "$(id -u)" -ne 0 ]; then _mscclpp_sudo="sudo"; fi

# --- NVRTC ---------------------------------------------------------------------------------
_mscclpp_nvrtc="$_mscclpp_root/.ci-deps/nvrtc"
if [ -z "$(find "$_mscclpp_nvrtc" -name 'libnvrtc.so.13' 2>/dev/null | head -n 1)" ]; then
  echo "install-toolchains: nvidia-cuda-nvrtc==13.0.88 into $_mscclpp_nvrtc"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$_mscclpp_nvrtc" "nvidia-cuda-nvrtc==13.0.88"
fi
_mscclpp_nvrtc_lib="$(dirname "$(find "$_mscclpp_nvrtc" -name 'libnvrtc.so.13' | head -n 1)")"
export LD_LIBRARY_PATH="$_mscclpp_nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "install-toolchains: NVRTC from $_mscclpp_nvrtc_lib"

# --- NCCL's headers ------------------------------------------------------------------------
_mscclpp_nccl="$_mscclpp_root/.ci-deps/nccl"
_mscclpp_nccl_inc="$_mscclpp_nccl/nvidia/nccl/include"
if [ ! -f "$_mscclpp_nccl_inc/nccl.h" ] || ! grep -q 'NCCL_VERSION_CODE 23206' "$_mscclpp_nccl_inc/nccl.h"; then
  echo "install-toolchains: nvidia-nccl-cu13==2.32.6's headers into $_mscclpp_nccl"
  rm -rf "$_mscclpp_nccl" && mkdir -p "$_mscclpp_nccl/wheel"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$_mscclpp_nccl/wheel" "nvidia-nccl-cu13==2.32.6"
  # Only the headers: the wheel's libnccl.so is not needed (and must not be found by accident).
  python3 - "$_mscclpp_nccl" <<'PY'
import glob, sys, zipfile
dest = sys.argv[1]
(wheel,) = glob.glob(dest + "/wheel/*.whl")
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("nvidia/nccl/include/")])
PY
  rm -rf "$_mscclpp_nccl/wheel"
fi
export MSCCLPP_NCCL_INCLUDE="$_mscclpp_nccl_inc"
echo "install-toolchains: NCCL headers from $MSCCLPP_NCCL_INCLUDE ($(grep -m 1 -o 'NCCL_VERSION_CODE [0-9]*' "$MSCCLPP_NCCL_INCLUDE/nccl.h"))"

# --- HIP (hipcc, hipRTC) -------------------------------------------------------------------
_mscclpp_hip_pkgs=(hipcc libamdhip64-5 libhiprtc-builtins5 rocm-device-libs)
if ! command -v hipcc >/dev/null 2>&1 || ! dpkg -s "${_mscclpp_hip_pkgs[@]}" >/dev/null 2>&1; then
  echo "install-toolchains: apt-get install ${_mscclpp_hip_pkgs[*]}"
  $_mscclpp_sudo apt-get update -qq
  $_mscclpp_sudo env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${_mscclpp_hip_pkgs[@]}" >/dev/null
fi
echo "install-toolchains: $(hipcc --version 2>/dev/null | grep -m 1 'HIP version')"

export MSCCLPP_REQUIRE_NVRTC=1
export MSCCLPP_REQUIRE_HIPRTC=1
export MSCCLPP_REQUIRE_HIPCC=1
export MSCCLPP_REQUIRE_NCCL_HEADERS=1

unset _mscclpp_root _mscclpp_sudo _mscclpp_nvrtc _mscclpp_nvrtc_lib _mscclpp_hip_pkgs _mscclpp_nccl \
  _mscclpp_nccl_inc

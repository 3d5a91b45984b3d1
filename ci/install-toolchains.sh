#!/usr/bin/env bash
# Installs the device compilers that the kernel compile tests use, on a CPU-only machine:
#   - NVRTC 13.0.88 (the compiler kernels/ptx-digests.txt was recorded with) from PyPI's
#     `nvidia-cuda-nvrtc` wheel into .ci-deps/nvrtc (its lib directory
#     goes on LD_LIBRARY_PATH), for backends/cuda's NVRTC path (sm_80, sm_90, sm_100);
#   - NCCL 2.32.6's headers (nccl.h, nccl_device/*.h) from PyPI's `nvidia-nccl-cu13` wheel into
#     .ci-deps/nccl (only `nvidia/nccl/include` is fetched), for nccl/tests/abi_232.rs, which
#     fails on any function they declare that libmscclpp_nccl.so does not export; the headers
#     of every version whose device-API layout is served (2.29.2 to 2.32.6) and CUDA 12.9's
#     headers, for nccl/tests/devapi_layout.rs;
#   - Debian's HIP 5.2 packages (hipcc, the runtime that holds hipRTC, its builtins, the device
#     libraries), for backends/rocm's hipRTC path and the hipcc check (gfx90a, gfx908).
# Then requires them: with MSCCLPP_REQUIRE_{NVRTC,HIPRTC,HIPCC,NCCL_HEADERS,DEVAPI_LAYOUT}=1 those tests fail
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
# Only the headers of each wheel are fetched (ci/wheel_files.py: range requests over the zip;
# a wheel is 200 MB, its headers 0.5 MB).
_mscclpp_nccl="$_mscclpp_root/.ci-deps/nccl"
_mscclpp_nccl_inc="$_mscclpp_nccl/nvidia/nccl/include"
if [ ! -f "$_mscclpp_nccl_inc/nccl.h" ] || ! grep -q 'NCCL_VERSION_CODE 23206' "$_mscclpp_nccl_inc/nccl.h"; then
  echo "install-toolchains: nvidia-nccl-cu13==2.32.6's headers into $_mscclpp_nccl"
  rm -rf "$_mscclpp_nccl"
  python3 "$_mscclpp_root/ci/wheel_files.py" nvidia-nccl-cu13 2.32.6 nvidia/nccl/include/ "$_mscclpp_nccl_inc"
fi
export MSCCLPP_NCCL_INCLUDE="$_mscclpp_nccl_inc"
echo "install-toolchains: NCCL headers from $MSCCLPP_NCCL_INCLUDE ($(grep -m 1 -o 'NCCL_VERSION_CODE [0-9]*' "$MSCCLPP_NCCL_INCLUDE/nccl.h"))"

# Every NCCL version whose device-API layout this library serves, for
# nccl/tests/devapi_layout.rs (offsetof against each version's headers, compiled with the host
# C++ compiler over CUDA 12.9's runtime, CCCL and nvcc/crt headers).
_mscclpp_versions="$_mscclpp_root/.ci-deps/nccl-versions"
for _v in 2.28.3 2.28.7 2.28.9 2.29.2 2.29.7 2.30.3 2.30.7 2.31.2 2.32.3 2.32.6; do
  if [ ! -f "$_mscclpp_versions/$_v/nccl.h" ]; then
    python3 "$_mscclpp_root/ci/wheel_files.py" nvidia-nccl-cu13 "$_v" nvidia/nccl/include/ "$_mscclpp_versions/$_v"
  fi
done
_mscclpp_cuda="$_mscclpp_root/.ci-deps/cuda-headers"
for _spec in "nvidia-cuda-runtime-cu12 12.9.79 nvidia/cuda_runtime/include/ runtime" \
             "nvidia-cuda-cccl-cu12 12.9.27 nvidia/cuda_cccl/include/ cccl" \
             "nvidia-cuda-nvcc-cu12 12.9.86 nvidia/cuda_nvcc/include/ nvcc"; do
  set -- $_spec
  if [ ! -d "$_mscclpp_cuda/$4" ]; then
    python3 "$_mscclpp_root/ci/wheel_files.py" "$1" "$2" "$3" "$_mscclpp_cuda/$4"
  fi
done
set --
export MSCCLPP_NCCL_HEADERS="$_mscclpp_versions"
export MSCCLPP_CUDA_INCLUDE="$_mscclpp_cuda/runtime:$_mscclpp_cuda/cccl:$_mscclpp_cuda/nvcc"

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
export MSCCLPP_REQUIRE_DEVAPI_LAYOUT=1

unset _mscclpp_root _mscclpp_sudo _mscclpp_nvrtc _mscclpp_nvrtc_lib _mscclpp_hip_pkgs _mscclpp_nccl \
  _mscclpp_nccl_inc _mscclpp_versions _mscclpp_cuda _v _spec

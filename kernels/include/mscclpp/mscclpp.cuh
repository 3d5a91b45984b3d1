// The whole mscclpp device API. Include this (or the single headers) from kernels; compiled by
// NVRTC (CUDA) or hipRTC/hipcc (HIP), with no toolkit headers.
#pragma once

#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"
#include "mscclpp/device_syncer.cuh"
#include "mscclpp/fifo.cuh"
#include "mscclpp/memory_channel.cuh"
#include "mscclpp/packet.cuh"
#include "mscclpp/port_channel.cuh"
#include "mscclpp/semaphore.cuh"
#include "mscclpp/switch_channel.cuh"

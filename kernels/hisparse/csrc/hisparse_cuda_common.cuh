// Shared pieces of the CUDA side: launch constants, the current stream, the
// per-device limits (read once per device, not per call), the pinned-memory
// and launch checks. Everything defined here is inline: the header is meant
// for one translation unit per build, but must not break the one-definition
// rule if a second includes it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>

#include "hisparse_checks.h"

#if !defined(USE_CUDA)
extern "C" AOTITorchError aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);
#endif

namespace hisparse {
namespace cuda {

constexpr int kWarp = 32;
constexpr int kResolveThreads = 1024;
constexpr int kResolveWarps = kResolveThreads / kWarp;
constexpr int kPlanThreads = 1024;
constexpr int kCompactThreads = 512;
constexpr int kInvalidateThreads = 256;
// Shared scalars of the resolver.
constexpr int kUnionCount = 0, kOverflow = 1, kRowValid = 2, kHitRefs = 3, kMissRefs = 4;
constexpr int kScalars = 8;

inline cudaStream_t current_stream(int32_t device_index) {
// torch 2.11 and 2.12 define no TORCH_VERSION_2_13_0: an undefined macro reads
// as 0 in #if, which would pick the 2.13 API, so test that it exists first.
#if defined(TORCH_VERSION_2_13_0) && TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
  return static_cast<cudaStream_t>(
      torch::stable::accelerator::getCurrentStream(device_index).nativeHandle());
#else
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(device_index, &stream) == AOTI_TORCH_SUCCESS,
                  "cannot get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
#endif
}

// The GPU reads host rows in place, so the pool must be page-locked (torch's
// pinned allocator or cudaHostRegister both qualify). Checked on every call,
// except during a CUDA graph capture for the pool this thread last checked
// (the capture's warm-up call checked it): a pointer query is no stream work,
// and not all driver queries are allowed while a stream captures.
inline void check_pinned(const Tensor& host_cache, cudaStream_t stream) {
  static thread_local const void* checked = nullptr;
  const void* pool = host_cache.const_data_ptr();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) cudaGetLastError();
  if (capture != cudaStreamCaptureStatusNone && pool == checked) return;
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, pool);
  if (status != cudaSuccess) cudaGetLastError();  // clear the sticky-free error state
  STD_TORCH_CHECK(status == cudaSuccess && attributes.type == cudaMemoryTypeHost,
                  "host_cache must be pinned CPU memory");
  checked = pool;
}

// Per-device limits, read from the driver once per device and process (a
// query per call costs a driver round trip on every decode step).
constexpr int kMaxDevices = 64;

inline int max_shared_memory_optin(int32_t device_index) {
  static std::atomic<int> cache[kMaxDevices] = {};  // 0: not read yet
  STD_TORCH_CHECK(device_index >= 0 && device_index < kMaxDevices, "CUDA device index ",
                  device_index, " out of range");
  int value = cache[device_index].load(std::memory_order_relaxed);
  if (value == 0) {
    STD_TORCH_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                           device_index) == cudaSuccess && value > 0,
                    "cannot read the GPU's shared memory per block");
    cache[device_index].store(value, std::memory_order_relaxed);
  }
  return value;
}

inline void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  STD_TORCH_CHECK(error == cudaSuccess, "HiSparse ", what, " launch failed: ",
                  cudaGetErrorString(error));
}

}  // namespace cuda
}  // namespace hisparse

// Shared pieces of the CUDA side: launch constants, the current stream, the
// pinned-memory and launch checks.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
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
#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
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
// pinned allocator or cudaHostRegister both qualify).
inline void check_pinned(const Tensor& host_cache) {
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, host_cache.const_data_ptr());
  if (status != cudaSuccess) cudaGetLastError();  // clear the sticky-free error state
  STD_TORCH_CHECK(status == cudaSuccess && attributes.type == cudaMemoryTypeHost,
                  "host_cache must be pinned CPU memory");
}

inline void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  STD_TORCH_CHECK(error == cudaSuccess, "HiSparse ", what, " launch failed: ",
                  cudaGetErrorString(error));
}

}  // namespace cuda
}  // namespace hisparse

// The gather and invalidation kernels and their launchers (see hisparse_cuda_impl.cuh).
#pragma once

#include "hisparse_cuda_common.cuh"

namespace hisparse {
namespace cuda {

// One row of row_bytes by one warp: 16-byte vectors where source, target and
// width allow, else 4-byte words, else bytes.
__device__ __forceinline__ void warp_copy_row(int lane, const char* src, char* dst, int64_t bytes) {
  const uintptr_t align = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                          static_cast<uintptr_t>(bytes);
  if ((align & 15u) == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (int64_t j = lane; j < bytes / 16; j += kWarp) __stcg(d + j, __ldcg(s + j));
  } else if ((align & 3u) == 0) {
    const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
    uint32_t* d = reinterpret_cast<uint32_t*>(dst);
    for (int64_t j = lane; j < bytes / 4; j += kWarp) d[j] = s[j];
  } else {
    for (int64_t j = lane; j < bytes; j += kWarp) dst[j] = src[j];
  }
}

__device__ __forceinline__ void warp_zero_row(int lane, char* dst, int64_t bytes) {
  const uintptr_t align = reinterpret_cast<uintptr_t>(dst) | static_cast<uintptr_t>(bytes);
  if ((align & 15u) == 0) {
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (int64_t j = lane; j < bytes / 16; j += kWarp) __stcg(d + j, make_uint4(0u, 0u, 0u, 0u));
  } else if ((align & 3u) == 0) {
    uint32_t* d = reinterpret_cast<uint32_t*>(dst);
    for (int64_t j = lane; j < bytes / 4; j += kWarp) d[j] = 0u;
  } else {
    for (int64_t j = lane; j < bytes; j += kWarp) dst[j] = 0;
  }
}

__device__ __forceinline__ void warp_gather(const GatherParams& p, int lane, int32_t g, int32_t dst) {
  const GatherAction action = gather_action(g, dst, p.host_rows, p.hot_rows);
  if (action == kGatherSkip) return;
  char* out = p.hot_cache +
              cache_row_offset_bytes(dst, p.hot_block_size, p.hot_block_stride_bytes, p.row_bytes);
  if (action == kGatherCopy) {
    warp_copy_row(lane, p.host_cache + static_cast<int64_t>(g) * p.row_bytes, out, p.row_bytes);
  } else {
    warp_zero_row(lane, out, p.row_bytes);
  }
}

__global__ __launch_bounds__(kPlanThreads) void gather_plan_kernel(GatherParams p) {
  const int32_t row = blockIdx.x;
  const int lane = threadIdx.x % kWarp;
  const int warps = blockDim.x / kWarp;
  const bool padding = p.request_state_indices != nullptr && p.request_state_indices[row] < 0;
  for (int32_t col = blockIdx.y * warps + threadIdx.x / kWarp; col < p.top_k; col += gridDim.y * warps) {
    const int64_t flat = static_cast<int64_t>(row) * p.top_k + col;
    const int32_t dst = p.hot_indices[flat];
    if (lane == 0 && p.attention_indices != nullptr) {
      p.attention_indices[flat] =
          padding ? -1 : attention_row(dst, p.hot_block_size, p.attention_block_stride);
    }
    if (padding || p.miss_mask[flat] == 0) continue;
    warp_gather(p, lane, p.global_indices[flat], dst);
  }
}

__global__ __launch_bounds__(kCompactThreads) void gather_compact_kernel(GatherParams p) {
  const int32_t row = blockIdx.x;
  const int lane = threadIdx.x % kWarp;
  const int warps = blockDim.x / kWarp;
  const int32_t count = compact_count(p.miss_counts[row], p.top_k);
  for (int32_t col = blockIdx.y * warps + threadIdx.x / kWarp; col < count; col += gridDim.y * warps) {
    const int64_t flat = static_cast<int64_t>(row) * p.top_k + col;
    warp_gather(p, lane, p.global_indices[flat], p.hot_indices[flat]);
  }
}

__global__ __launch_bounds__(kInvalidateThreads) void invalidate_kernel(InvalidateParams p) {
  const int64_t token = blockIdx.x;
  const int64_t slot = p.written_slots[token];
  const int32_t state = invalidation_state(p.req_id_per_token[token], p.num_requests,
                                           p.request_state_indices, p.num_state_rows, slot);
  if (state < 0) return;
  int32_t* row = p.device_global_indices + static_cast<int64_t>(state) * p.region_stride;
  for (int64_t i = threadIdx.x; i < p.region_stride; i += blockDim.x) {
    if (row[i] == slot) row[i] = -1;
  }
}

}  // namespace cuda

void gather_plan_cuda(const GatherParams& p, int32_t device_index, const Tensor& host_cache) {
  cuda::check_pinned(host_cache);
  if (p.num_rows == 0 || p.top_k == 0) return;
  const torch::stable::accelerator::DeviceGuard guard(device_index);
  // Spread a row's columns over enough blocks that few-row launches still keep
  // many host reads in flight; at least one column per warp.
  constexpr int kTargetBlocks = 256;
  constexpr int kWarps = cuda::kPlanThreads / cuda::kWarp;
  const int most = std::max(1, (p.top_k + kWarps - 1) / kWarps);
  const dim3 grid(p.num_rows, std::min(most, std::max(1, kTargetBlocks / p.num_rows)));
  cuda::gather_plan_kernel<<<grid, cuda::kPlanThreads, 0, cuda::current_stream(device_index)>>>(p);
  cuda::check_launch("gather_plan");
}

void gather_compact_cuda(const GatherParams& p, int32_t device_index,
                                const Tensor& host_cache) {
  cuda::check_pinned(host_cache);
  if (p.num_rows == 0 || p.top_k == 0) return;
  const torch::stable::accelerator::DeviceGuard guard(device_index);
  constexpr int kTargetBlocks = 64;
  const dim3 grid(p.num_rows, std::min(8, std::max(1, kTargetBlocks / p.num_rows)));
  cuda::gather_compact_kernel<<<grid, cuda::kCompactThreads, 0, cuda::current_stream(device_index)>>>(p);
  cuda::check_launch("gather_compact");
}

void invalidate_written_slots_cuda(const InvalidateParams& p, int32_t device_index) {
  if (p.num_tokens == 0 || p.num_state_rows == 0 || p.region_stride == 0) return;
  STD_TORCH_CHECK(p.num_tokens <= INT32_MAX, "too many tokens for one invalidation launch");
  const torch::stable::accelerator::DeviceGuard guard(device_index);
  cuda::invalidate_kernel<<<static_cast<unsigned>(p.num_tokens), cuda::kInvalidateThreads, 0,
                            cuda::current_stream(device_index)>>>(p);
  cuda::check_launch("invalidation");
}

}  // namespace hisparse

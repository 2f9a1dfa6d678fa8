// The gather and invalidation kernels and their launchers (see hisparse_cuda_impl.cuh).
//
// The gathers read host rows over the PCIe link, so they are bound by how many
// reads are in flight, not by bandwidth per read. Each warp takes the plan
// entries of 32 columns at a time (one per lane), lists the rows to copy or
// zero in shared memory, then walks the (row, vector) pairs of the whole group
// in batches: every lane loads kCopyBatch vectors into registers before it
// stores any of them, so a warp keeps up to 32 x kCopyBatch reads in flight
// instead of one row's. The vector width (16, 4 or 1 bytes) is fixed per
// launch from the alignment of the two base pointers, the row width and the
// block stride, which together decide the alignment of every row.
#pragma once

#include "hisparse_cuda_common.cuh"

namespace hisparse {
namespace cuda {

constexpr int kCopyBatch = 8;  // vectors a lane loads before it stores
constexpr int kPlanWarps = kPlanThreads / kWarp;
constexpr int kCompactWarps = kCompactThreads / kWarp;

// One warp's list of rows to move: the lanes of a group write it, the whole
// warp reads it. A null source zero-fills the target row.
struct RowList {
  const char* src[kWarp];
  char* dst[kWarp];
};

// Copies (or zero-fills) `count` rows of `units` vectors of type V listed in
// `rows`, all loads of a batch before its stores.
template <typename V>
__device__ __forceinline__ void warp_copy_rows(int lane, const RowList& rows, int count,
                                               int32_t units) {
  const int32_t total = count * units;
  for (int32_t base = 0; base < total; base += kWarp * kCopyBatch) {
    V v[kCopyBatch];
#pragma unroll
    for (int u = 0; u < kCopyBatch; ++u) {
      const int32_t f = base + u * kWarp + lane;
      if (f < total) {
        const int32_t r = f / units;
        const V* __restrict__ src = reinterpret_cast<const V*>(rows.src[r]);
        v[u] = src != nullptr ? __ldcg(src + (f - r * units)) : V{};
      }
    }
#pragma unroll
    for (int u = 0; u < kCopyBatch; ++u) {
      const int32_t f = base + u * kWarp + lane;
      if (f < total) {
        const int32_t r = f / units;
        V* __restrict__ dst = reinterpret_cast<V*>(rows.dst[r]);
        __stcg(dst + (f - r * units), v[u]);
      }
    }
  }
}

// This lane's entry (host row g to hot row dst) joins the warp's row list if
// it copies or zero-fills; then the warp moves the listed rows. Every lane of
// the warp calls it (lanes without an entry pass act = false).
template <typename V>
__device__ __forceinline__ void warp_gather_group(const GatherParams& p, RowList& rows, int lane,
                                                  bool act, int32_t g, int32_t dst) {
  const GatherAction action = act ? gather_action(g, dst, p.host_rows, p.hot_rows) : kGatherSkip;
  const unsigned listed = __ballot_sync(0xFFFFFFFFu, action != kGatherSkip);
  if (listed == 0) return;
  if (action != kGatherSkip) {
    const int slot = __popc(listed & ((1u << lane) - 1u));
    rows.src[slot] = action == kGatherCopy ? p.host_cache + static_cast<int64_t>(g) * p.row_bytes
                                           : nullptr;
    rows.dst[slot] = p.hot_cache + cache_row_offset_bytes(dst, p.hot_block_size,
                                                          p.hot_block_stride_bytes, p.row_bytes);
  }
  __syncwarp();
  warp_copy_rows<V>(lane, rows, __popc(listed), static_cast<int32_t>(p.row_bytes / sizeof(V)));
  __syncwarp();  // the list is read before the next group overwrites it
}

// Columns of one launch row, 32 a group: group `k` of warp `w` (of `warps`
// across the row's blocks) covers columns (k * warps + w) * 32 + lane.
template <typename V>
__global__ __launch_bounds__(kPlanThreads) void gather_plan_kernel(GatherParams p) {
  __shared__ RowList lists[kPlanWarps];
  const int32_t row = blockIdx.x;
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int32_t warps = gridDim.y * kPlanWarps;
  const bool padding = p.request_state_indices != nullptr && p.request_state_indices[row] < 0;
  for (int32_t start = (blockIdx.y * kPlanWarps + warp) * kWarp; start < p.top_k;
       start += warps * kWarp) {
    const int32_t col = start + lane;
    const bool in_row = col < p.top_k;
    const int64_t flat = static_cast<int64_t>(row) * p.top_k + col;
    const int32_t dst = in_row ? p.hot_indices[flat] : -1;
    if (in_row && p.attention_indices != nullptr) {
      p.attention_indices[flat] =
          padding ? -1 : attention_row(dst, p.hot_block_size, p.attention_block_stride);
    }
    const bool act = in_row && !padding && p.miss_mask[flat] != 0;
    warp_gather_group<V>(p, lists[warp], lane, act, act ? p.global_indices[flat] : -1, dst);
  }
}

template <typename V>
__global__ __launch_bounds__(kCompactThreads) void gather_compact_kernel(GatherParams p) {
  __shared__ RowList lists[kCompactWarps];
  const int32_t row = blockIdx.x;
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int32_t warps = gridDim.y * kCompactWarps;
  const int32_t count = compact_count(p.miss_counts[row], p.top_k);
  for (int32_t start = (blockIdx.y * kCompactWarps + warp) * kWarp; start < count;
       start += warps * kWarp) {
    const int32_t col = start + lane;
    const bool act = col < count;
    const int64_t flat = static_cast<int64_t>(row) * p.top_k + col;
    warp_gather_group<V>(p, lists[warp], lane, act, act ? p.global_indices[flat] : -1,
                         act ? p.hot_indices[flat] : -1);
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

// The widest vector every row of the launch is aligned to: rows start at
// base + g * row_bytes (host) and base + block * block_stride + k * row_bytes (hot).
inline int copy_width(const GatherParams& p) {
  const uintptr_t align = reinterpret_cast<uintptr_t>(p.host_cache) |
                          reinterpret_cast<uintptr_t>(p.hot_cache) |
                          static_cast<uintptr_t>(p.row_bytes) |
                          static_cast<uintptr_t>(p.hot_block_stride_bytes);
  return (align & 15u) == 0 ? 16 : ((align & 3u) == 0 ? 4 : 1);
}

inline void launch_gather_plan(const GatherParams& p, int32_t device_index,
                               const Tensor& host_cache) {
  const cudaStream_t stream = current_stream(device_index);
  check_pinned(host_cache, stream);
  if (p.num_rows == 0 || p.top_k == 0) return;
  STD_TORCH_CHECK(p.row_bytes <= INT32_MAX / kWarp, "KV rows too wide for one gather");
  const torch::stable::accelerator::DeviceGuard guard(device_index);
  // Spread a row's column groups over enough blocks that few-row launches
  // still keep many host reads in flight; at least one group per warp.
  constexpr int kTargetBlocks = 256;
  const int most = std::max(1, (p.top_k + kPlanThreads - 1) / kPlanThreads);
  const dim3 grid(p.num_rows, std::min(most, std::max(1, kTargetBlocks / p.num_rows)));
  switch (copy_width(p)) {
    case 16: gather_plan_kernel<uint4><<<grid, kPlanThreads, 0, stream>>>(p); break;
    case 4: gather_plan_kernel<unsigned int><<<grid, kPlanThreads, 0, stream>>>(p); break;
    default: gather_plan_kernel<unsigned char><<<grid, kPlanThreads, 0, stream>>>(p); break;
  }
  check_launch("gather_plan");
}

inline void launch_gather_compact(const GatherParams& p, int32_t device_index,
                                  const Tensor& host_cache) {
  const cudaStream_t stream = current_stream(device_index);
  check_pinned(host_cache, stream);
  if (p.num_rows == 0 || p.top_k == 0) return;
  STD_TORCH_CHECK(p.row_bytes <= INT32_MAX / kWarp, "KV rows too wide for one gather");
  const torch::stable::accelerator::DeviceGuard guard(device_index);
  constexpr int kTargetBlocks = 64;
  const int most = std::max(1, (p.top_k + kCompactThreads - 1) / kCompactThreads);
  const dim3 grid(p.num_rows, std::min(most, std::max(1, kTargetBlocks / p.num_rows)));
  switch (copy_width(p)) {
    case 16: gather_compact_kernel<uint4><<<grid, kCompactThreads, 0, stream>>>(p); break;
    case 4: gather_compact_kernel<unsigned int><<<grid, kCompactThreads, 0, stream>>>(p); break;
    default: gather_compact_kernel<unsigned char><<<grid, kCompactThreads, 0, stream>>>(p); break;
  }
  check_launch("gather_compact");
}

inline void launch_invalidate_written_slots(const InvalidateParams& p, int32_t device_index) {
  if (p.num_tokens == 0 || p.num_state_rows == 0 || p.region_stride == 0) return;
  STD_TORCH_CHECK(p.num_tokens <= INT32_MAX, "too many tokens for one invalidation launch");
  const torch::stable::accelerator::DeviceGuard guard(device_index);
  invalidate_kernel<<<static_cast<unsigned>(p.num_tokens), kInvalidateThreads, 0,
                      current_stream(device_index)>>>(p);
  check_launch("invalidation");
}

}  // namespace cuda
}  // namespace hisparse

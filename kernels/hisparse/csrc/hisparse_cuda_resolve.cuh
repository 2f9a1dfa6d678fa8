// The resolver kernel and its launcher (see hisparse_cuda_impl.cuh).
#pragma once

#include "hisparse_cuda_common.cuh"

namespace hisparse {
namespace cuda {

// Stable rank of this thread's flag among the block's flagged threads (all
// threads call it); `total` gets the block's count. Two barriers: the counts
// are complete before anyone reads them, and read before the next call
// overwrites them.
__device__ __forceinline__ int block_rank(bool flag, int32_t* warp_counts, int& total) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const unsigned ballot = __ballot_sync(0xFFFFFFFFu, flag);
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = 0;
  total = 0;
  const int warps = blockDim.x / kWarp;
  for (int w = 0; w < warps; ++w) {
    const int c = warp_counts[w];
    before += w < warp ? c : 0;
    total += c;
  }
  __syncthreads();
  return before + __popc(ballot & ((1u << lane) - 1u));
}

__device__ __forceinline__ int32_t table_find(const int32_t* keys, int32_t size, int32_t key) {
  int32_t b = hash_home(key, size);
  for (int32_t probe = 0; probe < size; ++probe) {
    const int32_t k = keys[b];
    if (k == key) return b;
    if (k == kNoKey) return -1;
    b = hash_next(b, size);
  }
  return -1;
}

__device__ __forceinline__ void publish(const ResolveParams& p, int32_t row, int32_t col,
                                        int32_t physical_row) {
  p.hot_indices[static_cast<int64_t>(row) * p.top_k + col] = physical_row;
  if (p.attention_indices != nullptr) {
    p.attention_indices[static_cast<int64_t>(row) * p.attention_row_stride + col] =
        attention_row(physical_row, p.hot_block_size, p.attention_block_stride);
  }
}

__device__ __forceinline__ int32_t slot_row(const ResolveParams& p, int32_t request, int32_t slot) {
  return static_cast<int32_t>(
      hot_physical_row(p.hot_table, p.hot_table_stride, p.hot_block_size, request, slot));
}

// Shared memory of one resolver block for a union table of `capacity` buckets.
inline size_t resolve_smem_bytes(int32_t capacity, int32_t hot_size) {
  return sizeof(int32_t) * (2 * static_cast<size_t>(capacity) + kResolveWarps + kScalars) +
         sizeof(int16_t) * static_cast<size_t>(hot_size);
}

__global__ __launch_bounds__(kResolveThreads) void resolve_kernel(ResolveParams p) {
  const int32_t first = blockIdx.x;
  if (!leads_run(p.request_ids, first)) return;  // the run's first row resolves it
  int32_t end = first + 1;
  while (end < p.num_rows && !leads_run(p.request_ids, end)) ++end;
  const int tid = threadIdx.x;
  const int32_t request = request_of_row(p.request_ids, first);
  int32_t state = state_row_of(p.request_state_indices, p.request_state_count, request);
  if (state >= 0) {  // block-uniform: a state row an earlier run names is that run's
    bool taken = false;
    for (int32_t row = tid; row < first; row += blockDim.x) {
      taken = taken || run_claims_state(p.request_ids, p.request_state_indices,
                                        p.request_state_count, row, state);
    }
    if (__syncthreads_or(taken)) state = -1;
  }

  if (state < 0) {  // CUDA-graph padding (or a later run of a state): publish -1, touch no state
    for (int32_t row = first; row < end; ++row) {
      for (int32_t i = tid; i < p.top_k; i += blockDim.x) {
        publish(p, row, i, -1);
        if (p.resolved_global_indices != nullptr) {
          p.resolved_global_indices[static_cast<int64_t>(row) * p.top_k + i] = -1;
        }
      }
      if (tid == 0 && p.valid_counts != nullptr) p.valid_counts[row * p.valid_count_stride] = 0;
      if (tid == 0 && p.swap_counts != nullptr) p.swap_counts[row] = 0;
    }
    return;
  }

  const int32_t capacity = p.table_capacity;
  extern __shared__ __align__(16) unsigned char smem[];
  int32_t* keys = reinterpret_cast<int32_t*>(smem);
  int32_t* values = keys + capacity;
  int32_t* warp_counts = values + capacity;
  int32_t* scalars = warp_counts + kResolveWarps;
  int16_t* packed = reinterpret_cast<int16_t*>(scalars + kScalars);

  const int32_t positions = (end - first) * p.top_k;
  const int32_t table_size = union_table_size(capacity, positions);
  for (int32_t i = tid; i < table_size; i += blockDim.x) {
    keys[i] = kNoKey;
    values[i] = kUnresolved;
  }
  if (tid < kScalars) scalars[tid] = 0;
  __syncthreads();

  // Phase 1: translate; resident and absent positions are final, the rest
  // join the union with their first (smallest) position.
  for (int32_t row = first; row < end; ++row) {
    int32_t valid = 0;
    for (int32_t i = tid; i < p.top_k; i += blockDim.x) {
      const int64_t flat = static_cast<int64_t>(row) * p.top_k + i;
      const Translated t = translate_position(
          p.map, p.global_indices[static_cast<int64_t>(row) * p.input_row_stride + i], request);
      if (p.resolved_global_indices != nullptr) p.resolved_global_indices[flat] = t.host_row;
      valid += (t.resident_row >= 0 || t.host_row >= 0) ? 1 : 0;
      if (p.miss_mask != nullptr) p.miss_mask[flat] = 0;
      if (t.resident_row >= 0) {
        publish(p, row, i, t.resident_row);
      } else if (t.host_row < 0) {
        publish(p, row, i, -1);
      } else {
        const int32_t position = (row - first) * p.top_k + i;
        int32_t b = hash_home(t.host_row, table_size);
        bool placed = false;
        for (int32_t probe = 0; probe < table_size && !placed; ++probe) {
          const int32_t prev = atomicCAS(&keys[b], kNoKey, t.host_row);
          if (prev == kNoKey || prev == t.host_row) {
            if (prev == kNoKey) atomicAdd(&scalars[kUnionCount], 1);
            atomicMin(&values[b], position);
            placed = true;
          } else {
            b = hash_next(b, table_size);
          }
        }
        if (!placed) atomicOr(&scalars[kOverflow], 1);
      }
    }
    atomicAdd(&scalars[kRowValid], valid);
    __syncthreads();
    if (tid == 0) {
      if (p.valid_counts != nullptr) p.valid_counts[row * p.valid_count_stride] = scalars[kRowValid];
      scalars[kRowValid] = 0;
    }
    __syncthreads();
  }
  const int32_t union_count = scalars[kUnionCount];
  if (scalars[kOverflow] != 0 || union_count > p.max_union_rows) {
    // The table and the eviction plan are sized for max_union_rows; going on
    // would address past them. Same contract as vLLM's kernel: trap.
    if (tid == 0) {
      printf("HiSparse residency: request %d resolves more than max_union_rows=%d host rows\n",
             request, p.max_union_rows);
    }
    __trap();
  }
  if (union_count == 0) {  // no lookups: the LRU is neither read nor rewritten
    for (int32_t row = first + tid; row < end; row += blockDim.x) {
      if (p.swap_counts != nullptr) p.swap_counts[row] = 0;
    }
    return;
  }

  int32_t* dgi = p.device_global_indices + static_cast<int64_t>(state) * p.region_stride;
  int16_t* lru = p.lru_slots + static_cast<int64_t>(state) * p.hot_size;

  // Phase 2: classify the hot slots in LRU order; pack hits from the front and
  // evictables from the back, both in LRU order.
  int32_t hits = 0;
  int32_t evictables = 0;
  for (int32_t base = 0; base < p.hot_size; base += blockDim.x) {
    const int32_t pos = base + tid;
    const bool in_range = pos < p.hot_size;
    const int16_t slot = in_range ? lru[pos] : static_cast<int16_t>(-1);
    const int32_t cached = in_range && slot_in_region(slot, p.region_stride) ? dgi[slot] : -1;
    const int32_t b = cached >= 0 ? table_find(keys, table_size, cached) : -1;
    if (b >= 0) values[b] = kTagHit | slot;
    int tile_hits = 0;
    int tile_evictables = 0;
    const int hit_rank = block_rank(b >= 0, warp_counts, tile_hits);
    const int evict_rank = block_rank(in_range && b < 0, warp_counts, tile_evictables);
    if (b >= 0) packed[hits + hit_rank] = slot;
    if (in_range && b < 0) packed[evictable_index(evictables + evict_rank, p.hot_size)] = slot;
    hits += tile_hits;
    evictables += tile_evictables;
  }
  __syncthreads();

  // Phase 3, one tile of positions at a time in (row, top-k) order: first
  // references of unresolved entries take the oldest evictable slots; after a
  // barrier every entry a tile references is resolved and all publish.
  int32_t misses = 0;
  int32_t hit_refs = 0;
  int32_t miss_refs = 0;
  const int64_t plan_base = static_cast<int64_t>(first) * p.top_k;
  for (int32_t base = 0; base < positions; base += blockDim.x) {
    const int32_t position = base + tid;
    const int32_t row = first + position / p.top_k;
    const int32_t col = position % p.top_k;
    int32_t g = -1;
    int32_t b = -1;
    bool first_reference = false;
    if (position < positions) {
      const Translated t = translate_position(
          p.map, p.global_indices[static_cast<int64_t>(row) * p.input_row_stride + col], request);
      if (t.resident_row < 0 && t.host_row >= 0) {
        g = t.host_row;
        b = table_find(keys, table_size, g);
        first_reference = values[b] == position;
      }
    }
    int tile_misses = 0;
    const int miss_rank = block_rank(first_reference, warp_counts, tile_misses);
    if (first_reference) {
      const int32_t m = misses + miss_rank;
      const int32_t evict_slot = packed[evictable_index(m, p.hot_size)];
      const int32_t entry = miss_entry(evict_slot, p.region_stride);
      values[b] = entry;
      if (p.swap_host_rows != nullptr) {
        p.swap_host_rows[plan_base + m] = g;
        p.swap_device_rows[plan_base + m] = (entry & kTagMiss) ? slot_row(p, request, evict_slot) : -1;
      }
      if (entry & kTagMiss) dgi[evict_slot] = g;
    }
    __syncthreads();
    if (b >= 0) {
      const Reference ref = reference_outcome(values[b], first_reference);
      publish(p, row, col, ref.slot < 0 ? -1 : slot_row(p, request, ref.slot));
      if (ref.miss && p.miss_mask != nullptr) {
        p.miss_mask[static_cast<int64_t>(row) * p.top_k + col] = 1;
      }
      hit_refs += ref.hit ? 1 : 0;
      miss_refs += ref.miss ? 1 : 0;
    }
    misses += tile_misses;
  }

  if (p.swap_counts != nullptr) {
    for (int32_t row = first + tid; row < end; row += blockDim.x) {
      p.swap_counts[row] = swap_count_for_row(misses, row - first, p.top_k);
    }
  }
  if (p.stats != nullptr) {
    atomicAdd(&scalars[kHitRefs], hit_refs);
    atomicAdd(&scalars[kMissRefs], miss_refs);
  }
  __syncthreads();
  if (p.stats != nullptr && tid == 0) {
    auto* stats = reinterpret_cast<unsigned long long*>(p.stats);
    atomicAdd(&stats[0], static_cast<unsigned long long>(scalars[kHitRefs]));
    atomicAdd(&stats[1], static_cast<unsigned long long>(scalars[kMissRefs]));
  }

  // Phase 4: the new LRU order.
  for (int32_t i = tid; i < p.hot_size; i += blockDim.x) {
    lru[i] = packed[lru_source_index(i, p.hot_size, hits, misses)];
  }
}

// Raises the resolver's dynamic shared memory limit to the device's opt-in
// maximum, once per device (the attribute belongs to the function on the
// current device; concurrent first calls set the same value).
inline void allow_resolver_smem(int32_t device_index) {
  static std::atomic<bool> raised[kMaxDevices] = {};
  if (raised[device_index].load(std::memory_order_acquire)) return;
  STD_TORCH_CHECK(cudaFuncSetAttribute(resolve_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       max_shared_memory_optin(device_index)) == cudaSuccess,
                  "cannot raise the resolver's shared memory limit");
  raised[device_index].store(true, std::memory_order_release);
}

inline void launch_resolve_residency(const ResolveParams& params, int32_t device_index,
                                     const Tensor& host_cache) {
  const cudaStream_t stream = current_stream(device_index);
  check_pinned(host_cache, stream);
  if (params.num_rows == 0 || params.top_k == 0) return;
  const torch::stable::accelerator::DeviceGuard guard(device_index);
  const int max_smem = max_shared_memory_optin(device_index);
  // A roomy union table where shared memory allows, else the tight one.
  ResolveParams p = params;
  if (resolve_smem_bytes(p.table_capacity, p.hot_size) > static_cast<size_t>(max_smem)) {
    p.table_capacity = tight_union_capacity(p.max_union_rows);
  }
  const size_t smem = resolve_smem_bytes(p.table_capacity, p.hot_size);
  STD_TORCH_CHECK(smem <= static_cast<size_t>(max_smem), "HiSparse residency with hot size ",
                  p.hot_size, " and max_union_rows ", p.max_union_rows, " needs ", smem,
                  " bytes of shared memory per block; this GPU allows ", max_smem,
                  ": lower device_buffer_size or the number of speculative tokens");
  if (smem > 48 * 1024) allow_resolver_smem(device_index);
  resolve_kernel<<<p.num_rows, kResolveThreads, smem, stream>>>(p);
  check_launch("residency");
}

}  // namespace cuda
}  // namespace hisparse

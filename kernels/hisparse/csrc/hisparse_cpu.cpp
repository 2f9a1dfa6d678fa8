// CPU implementation of the four HiSparse ops. Same contract and results as
// the CUDA kernels: the per-entry rules come from hisparse_logic.h, and the
// resolver keeps the GPU's packed LRU layout and union table, walked in order
// instead of in parallel (the order-dependent steps of the GPU version are
// stable compactions, so a sequential walk gives the same result).
#include <cstring>
#include <vector>

#include "hisparse_ops.h"

namespace hisparse {
namespace {

void publish(const ResolveParams& p, int32_t row, int32_t col, int32_t physical_row) {
  p.hot_indices[static_cast<int64_t>(row) * p.top_k + col] = physical_row;
  if (p.attention_indices != nullptr) {
    p.attention_indices[static_cast<int64_t>(row) * p.attention_row_stride + col] =
        attention_row(physical_row, p.hot_block_size, p.attention_block_stride);
  }
}

void publish_padding_row(const ResolveParams& p, int32_t row) {
  for (int32_t i = 0; i < p.top_k; ++i) {
    publish(p, row, i, -1);
    if (p.resolved_global_indices != nullptr) {
      p.resolved_global_indices[static_cast<int64_t>(row) * p.top_k + i] = -1;
    }
  }
  if (p.valid_counts != nullptr) p.valid_counts[row * p.valid_count_stride] = 0;
  if (p.swap_counts != nullptr) p.swap_counts[row] = 0;
}

// Open-addressing union of a run's host rows, the same table the GPU builds.
struct UnionTable {
  std::vector<int32_t> keys;
  std::vector<int32_t> values;
  int32_t size = 0;
  int64_t count = 0;

  void reset(int32_t table_size) {
    size = table_size;
    keys.assign(table_size, kNoKey);
    values.assign(table_size, kUnresolved);
    count = 0;
  }
  // Bucket of `key`, inserting it; -1 when the table is full.
  int32_t insert(int32_t key) {
    int32_t b = hash_home(key, size);
    for (int32_t probe = 0; probe < size; ++probe) {
      if (keys[b] == key) return b;
      if (keys[b] == kNoKey) {
        keys[b] = key;
        ++count;
        return b;
      }
      b = hash_next(b, size);
    }
    return -1;
  }
  int32_t find(int32_t key) const {
    int32_t b = hash_home(key, size);
    for (int32_t probe = 0; probe < size; ++probe) {
      if (keys[b] == key) return b;
      if (keys[b] == kNoKey) return -1;
      b = hash_next(b, size);
    }
    return -1;
  }
};

// One run: the consecutive rows [first, end) of one request.
void resolve_run(const ResolveParams& p, int32_t first, int32_t end, UnionTable& table,
                 std::vector<int32_t>& host_rows, std::vector<int16_t>& packed) {
  const int32_t request = request_of_row(p.request_ids, first);
  int32_t state = state_row_of(p.request_state_indices, p.request_state_count, request);
  for (int32_t row = 0; state >= 0 && row < first; ++row) {  // owned by an earlier run
    if (run_claims_state(p.request_ids, p.request_state_indices, p.request_state_count, row, state)) {
      state = -1;
    }
  }
  if (state < 0) {
    for (int32_t row = first; row < end; ++row) publish_padding_row(p, row);
    return;
  }
  int32_t* dgi = p.device_global_indices + static_cast<int64_t>(state) * p.region_stride;
  int16_t* lru = p.lru_slots + static_cast<int64_t>(state) * p.hot_size;
  const int32_t positions = (end - first) * p.top_k;
  table.reset(union_table_size(p.table_capacity, positions));
  host_rows.assign(positions, -1);

  // Phase 1: translate; resident pages and absent rows are final here, the
  // rest join the union keyed by host row, remembering their first position.
  bool overflow = false;
  for (int32_t row = first; row < end; ++row) {
    int32_t valid = 0;
    for (int32_t i = 0; i < p.top_k; ++i) {
      const int64_t flat = static_cast<int64_t>(row) * p.top_k + i;
      const int32_t position = (row - first) * p.top_k + i;
      const Translated t = translate_position(
          p.map, p.global_indices[static_cast<int64_t>(row) * p.input_row_stride + i], request);
      if (p.resolved_global_indices != nullptr) p.resolved_global_indices[flat] = t.host_row;
      if (t.resident_row >= 0 || t.host_row >= 0) ++valid;
      if (p.miss_mask != nullptr) p.miss_mask[flat] = 0;
      if (t.resident_row >= 0) {
        publish(p, row, i, t.resident_row);
      } else if (t.host_row < 0) {
        publish(p, row, i, -1);
      } else {
        host_rows[position] = t.host_row;
        const int32_t b = table.insert(t.host_row);
        if (b < 0) {
          overflow = true;
        } else if (table.values[b] == kUnresolved) {
          table.values[b] = position;
        }
      }
    }
    if (p.valid_counts != nullptr) p.valid_counts[row * p.valid_count_stride] = valid;
  }
  STD_TORCH_CHECK(!overflow && table.count <= p.max_union_rows, "HiSparse residency: request ",
                  request, " resolves ", overflow ? table.count + 1 : table.count,
                  " host rows, above max_union_rows=", p.max_union_rows);
  if (table.count == 0) {
    // Nothing to look up: the hot LRU is neither read nor rewritten.
    for (int32_t row = first; row < end; ++row) {
      if (p.swap_counts != nullptr) p.swap_counts[row] = 0;
    }
    return;
  }

  // Phase 2: classify hot slots in LRU order into the packed array.
  int32_t hits = 0;
  int32_t evictables = 0;
  for (int32_t pos = 0; pos < p.hot_size; ++pos) {
    const int16_t slot = lru[pos];
    const int32_t cached = slot_in_region(slot, p.region_stride) ? dgi[slot] : -1;
    const int32_t b = cached >= 0 ? table.find(cached) : -1;
    if (b >= 0) {
      table.values[b] = kTagHit | slot;
      packed[hits++] = slot;
    } else {
      packed[evictable_index(evictables++, p.hot_size)] = slot;
    }
  }

  // Phase 3: first references of unresolved entries are misses, given the
  // oldest evictable slots in position order; every reference publishes.
  int32_t misses = 0;
  uint64_t hit_refs = 0;
  uint64_t miss_refs = 0;
  const int64_t plan_base = static_cast<int64_t>(first) * p.top_k;
  for (int32_t position = 0; position < positions; ++position) {
    const int32_t g = host_rows[position];
    if (g < 0) continue;
    const int32_t b = table.find(g);
    const bool first_reference = table.values[b] == position;
    if (first_reference) {
      const int32_t evict_slot = packed[evictable_index(misses, p.hot_size)];
      const int32_t entry = miss_entry(evict_slot, p.region_stride);
      table.values[b] = entry;
      if (p.swap_host_rows != nullptr) {
        p.swap_host_rows[plan_base + misses] = g;
        p.swap_device_rows[plan_base + misses] =
            (entry & kTagMiss) ? static_cast<int32_t>(hot_physical_row(
                                     p.hot_table, p.hot_table_stride, p.hot_block_size,
                                     request, evict_slot))
                               : -1;
      }
      if (entry & kTagMiss) dgi[evict_slot] = g;
      ++misses;
    }
    const Reference ref = reference_outcome(table.values[b], first_reference);
    const int32_t row = first + position / p.top_k;
    const int32_t col = position % p.top_k;
    publish(p, row, col,
            ref.slot < 0 ? -1
                         : static_cast<int32_t>(hot_physical_row(
                               p.hot_table, p.hot_table_stride, p.hot_block_size, request,
                               ref.slot)));
    if (ref.miss && p.miss_mask != nullptr) {
      p.miss_mask[static_cast<int64_t>(row) * p.top_k + col] = 1;
    }
    hit_refs += ref.hit ? 1 : 0;
    miss_refs += ref.miss ? 1 : 0;
  }
  if (p.swap_counts != nullptr) {
    for (int32_t row = first; row < end; ++row) {
      p.swap_counts[row] = swap_count_for_row(misses, row - first, p.top_k);
    }
  }
  if (p.stats != nullptr) {
    p.stats[0] += hit_refs;
    p.stats[1] += miss_refs;
  }

  // Phase 4: the new LRU order.
  for (int32_t i = 0; i < p.hot_size; ++i) {
    lru[i] = packed[lru_source_index(i, p.hot_size, hits, misses)];
  }
}

void copy_or_zero(const GatherParams& p, int32_t g, int32_t dst) {
  const GatherAction action = gather_action(g, dst, p.host_rows, p.hot_rows);
  if (action == kGatherSkip) return;
  char* out = p.hot_cache +
              cache_row_offset_bytes(dst, p.hot_block_size, p.hot_block_stride_bytes, p.row_bytes);
  if (action == kGatherCopy) {
    std::memcpy(out, p.host_cache + static_cast<int64_t>(g) * p.row_bytes, p.row_bytes);
  } else {
    std::memset(out, 0, p.row_bytes);
  }
}

}  // namespace

void resolve_residency_cpu(const ResolveParams& p) {
  if (p.num_rows == 0 || p.top_k == 0) return;
  UnionTable table;
  std::vector<int32_t> host_rows;
  std::vector<int16_t> packed(p.hot_size, -1);
  int32_t first = 0;
  while (first < p.num_rows) {
    int32_t end = first + 1;
    while (end < p.num_rows && !leads_run(p.request_ids, end)) ++end;
    resolve_run(p, first, end, table, host_rows, packed);
    first = end;
  }
}

void gather_plan_cpu(const GatherParams& p) {
  for (int32_t row = 0; row < p.num_rows; ++row) {
    const bool padding =
        p.request_state_indices != nullptr && p.request_state_indices[row] < 0;
    for (int32_t col = 0; col < p.top_k; ++col) {
      const int64_t flat = static_cast<int64_t>(row) * p.top_k + col;
      const int32_t dst = p.hot_indices[flat];
      if (p.attention_indices != nullptr) {
        p.attention_indices[flat] =
            padding ? -1 : attention_row(dst, p.hot_block_size, p.attention_block_stride);
      }
      if (padding || p.miss_mask[flat] == 0) continue;
      copy_or_zero(p, p.global_indices[flat], dst);
    }
  }
}

void gather_compact_cpu(const GatherParams& p) {
  for (int32_t row = 0; row < p.num_rows; ++row) {
    const int32_t count = compact_count(p.miss_counts[row], p.top_k);
    for (int32_t col = 0; col < count; ++col) {
      const int64_t flat = static_cast<int64_t>(row) * p.top_k + col;
      copy_or_zero(p, p.global_indices[flat], p.hot_indices[flat]);
    }
  }
}

void invalidate_written_slots_cpu(const InvalidateParams& p) {
  for (int64_t token = 0; token < p.num_tokens; ++token) {
    const int64_t slot = p.written_slots[token];
    const int32_t state =
        invalidation_state(p.req_id_per_token[token], p.num_requests,
                           p.request_state_indices, p.num_state_rows, slot);
    if (state < 0) continue;
    int32_t* row = p.device_global_indices + static_cast<int64_t>(state) * p.region_stride;
    for (int64_t i = 0; i < p.region_stride; ++i) {
      if (row[i] == slot) row[i] = -1;
    }
  }
}

}  // namespace hisparse

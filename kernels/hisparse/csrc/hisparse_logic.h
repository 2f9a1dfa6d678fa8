// Per-entry index rules of the four HiSparse ops, shared by the CPU and CUDA
// implementations (and the vLLM drop-in) so that the CPU build, which the
// tests run everywhere, exercises the same index code the GPU runs.
//
// Nothing here touches torch: plain integers and pointers only. Every function
// is a pure rule on one entry (one top-k position, one LRU position, one plan
// column); the loops and the parallel compaction around them live in the
// CPU and CUDA files.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HS_HD __host__ __device__ __forceinline__
#else
#define HS_HD inline
#endif

namespace hisparse {

// Resolver union-table values. An entry first holds the smallest (row, top-k)
// position that references it; once resolved it holds a hot slot and a tag.
constexpr int32_t kNoKey = -1;
constexpr int32_t kUnresolved = 0x7FFFFFFF;
constexpr int32_t kTagHit = 1 << 30;
constexpr int32_t kTagMiss = 1 << 29;
constexpr int32_t kTagInvalid = 1 << 28;
constexpr int32_t kTagMask = kTagHit | kTagMiss | kTagInvalid;
constexpr int32_t kSlotBits = 0xFFFF;
constexpr int32_t kMaxHotSize = 32768;  // LRU slots are int16

// ---- block-table translation ------------------------------------------------

// The tables that turn a request-relative top-k position into rows.
struct SourceMap {
  const int32_t* source_table;  // [source_rows, source_cols] or null: positions are host rows
  int64_t source_stride;
  int32_t source_rows;
  int32_t source_cols;
  int32_t source_block_size;
  const int32_t* resident_table;  // [resident_rows, resident_cols] or null
  int64_t resident_stride;
  int32_t resident_rows;
  int32_t resident_cols;
  int32_t resident_block_size;
  int32_t resident_null_block;
  int64_t host_rows;
};

struct Translated {
  int32_t host_row;      // -1: no host row backs this position
  int32_t resident_row;  // -1: the page is not resident on the GPU
};

// Looks one table up; -2 when (request, block) falls outside the table.
HS_HD int32_t table_block(const int32_t* table, int64_t stride, int32_t rows,
                          int32_t cols, int32_t request, int32_t block) {
  if (request < 0 || request >= rows || block < 0 || block >= cols) return -2;
  return table[static_cast<int64_t>(request) * stride + block];
}

HS_HD Translated translate_position(const SourceMap& map, int32_t position,
                                    int32_t request) {
  Translated out{position, -1};
  if (map.source_table != nullptr) {
    const int32_t block = position >= 0 ? position / map.source_block_size : -1;
    const int32_t page = table_block(map.source_table, map.source_stride,
                                     map.source_rows, map.source_cols, request, block);
    // Source page 0 is the null page: only pages > 0 are host-backed.
    out.host_row = page > 0 ? page * map.source_block_size +
                                  position % map.source_block_size
                            : -1;
    if (map.resident_table != nullptr) {
      const int32_t rblock =
          position >= 0 ? position / map.resident_block_size : -1;
      const int32_t rpage =
          table_block(map.resident_table, map.resident_stride, map.resident_rows,
                      map.resident_cols, request, rblock);
      if (rpage >= 0 && rpage != map.resident_null_block) {
        out.resident_row =
            rpage * map.resident_block_size + position % map.resident_block_size;
      }
    }
  }
  if (out.host_row >= map.host_rows) out.host_row = -1;
  return out;
}

// ---- rows, states and addresses -----------------------------------------------

HS_HD int32_t request_of_row(const int32_t* request_ids, int32_t row) {
  return request_ids != nullptr ? request_ids[row] : row;
}

// A row leads its run: the maximal block of consecutive rows of one request.
HS_HD bool leads_run(const int32_t* request_ids, int32_t row) {
  return request_ids == nullptr || row == 0 ||
         request_ids[row - 1] != request_ids[row];
}

// Long-lived state row of a request; -1 marks a CUDA-graph padding request.
HS_HD int32_t state_row_of(const int32_t* request_state_indices,
                           int32_t request_state_count, int32_t request) {
  if (request_state_indices == nullptr) return request;
  if (request < 0 || request >= request_state_count) return -1;
  return request_state_indices[request];
}

// One state row, one run: a launch may name a state row in more than one run
// (CUDA-graph padding rows appended after the real ones map to request 0; a
// caller may give two requests one state row). Two runs updating one state's
// LRU and hot indices at once (two GPU blocks) would leave the LRU no
// permutation, so the first run that names a state row owns it, and a later
// run naming it resolves as padding: -1 published, no state touched.
// True when row `row` leads a run whose state row is `state`.
HS_HD bool run_claims_state(const int32_t* request_ids, const int32_t* request_state_indices,
                            int32_t request_state_count, int32_t row, int32_t state) {
  return leads_run(request_ids, row) &&
         state_row_of(request_state_indices, request_state_count,
                      request_of_row(request_ids, row)) == state;
}

// Physical row of a request's hot slot, through its hot block table row.
HS_HD int64_t hot_physical_row(const int32_t* hot_table, int64_t table_stride,
                               int32_t block_size, int32_t request, int32_t slot) {
  const int32_t block =
      hot_table[static_cast<int64_t>(request) * table_stride + slot / block_size];
  return static_cast<int64_t>(block) * block_size + slot % block_size;
}

// Row index the attention kernel reads: blocks are attention_block_stride
// rows apart in the packed slab, rows within a block are contiguous.
HS_HD int32_t attention_row(int32_t physical_row, int32_t block_size,
                            int64_t attention_block_stride) {
  if (physical_row < 0) return -1;
  return static_cast<int32_t>(
      static_cast<int64_t>(physical_row / block_size) * attention_block_stride +
      physical_row % block_size);
}

HS_HD int64_t cache_row_offset_bytes(int64_t row, int32_t block_size,
                                     int64_t block_stride_bytes, int64_t row_bytes) {
  return (row / block_size) * block_stride_bytes + (row % block_size) * row_bytes;
}

// ---- the union table -------------------------------------------------------------

// Home bucket of a host row: a multiplicative hash scaled onto [0, size) by a
// multiply-high, so any table size works without a division.
HS_HD int32_t hash_home(int32_t key, int32_t size) {
  const uint32_t mixed = static_cast<uint32_t>(key) * 0x9E3779B1u;
#if defined(__CUDA_ARCH__)
  return static_cast<int32_t>(__umulhi(mixed, static_cast<uint32_t>(size)));
#else
  return static_cast<int32_t>(
      (static_cast<uint64_t>(mixed) * static_cast<uint32_t>(size)) >> 32);
#endif
}

HS_HD int32_t hash_next(int32_t bucket, int32_t size) {
  return bucket + 1 == size ? 0 : bucket + 1;
}

// Table size for a run. `capacity` (at least max_union_rows + 1) bounds it;
// a run with few positions gets a smaller table. Either way at most half full
// or one bucket above the union bound, so every probe ends; a union above
// max_union_rows is detected by its count (or a full table), not by the size.
HS_HD int32_t union_table_size(int32_t capacity, int32_t run_positions) {
  const int64_t roomy = 2 * static_cast<int64_t>(run_positions) + 1;
  return static_cast<int32_t>(roomy < capacity ? roomy : capacity);
}

// Preferred capacity: twice the bound keeps linear probing short (a table
// filled to the bound would make lookups scan most of it).
HS_HD int32_t roomy_union_capacity(int32_t max_union_rows) {
  return 2 * max_union_rows + 1;
}

HS_HD int32_t tight_union_capacity(int32_t max_union_rows) { return max_union_rows + 1; }

// ---- LRU compaction layout ----------------------------------------------------
// Phase 2 packs the hot slots into one int16 array of hot_size entries: hits
// from the front in LRU order, evictable slots from the back in LRU order (the
// oldest evictable last). Misses take evictables oldest first.

HS_HD int32_t evictable_index(int32_t ordinal, int32_t hot_size) {
  return hot_size - 1 - ordinal;
}

HS_HD bool slot_in_region(int32_t slot, int64_t region_stride) {
  return slot >= 0 && slot < region_stride;
}

// New LRU order, oldest first: untouched stale evictables, then the slots
// this step filled (in miss order), then the hits (in their old order).
// Returns where LRU position `i` takes its slot from in the packed array.
HS_HD int32_t lru_source_index(int32_t i, int32_t hot_size, int32_t hits,
                               int32_t misses) {
  const int32_t stale = hot_size - hits - misses;
  if (i < stale) return hot_size - 1 - misses - i;
  if (i < stale + misses) return hot_size - 1 - (i - stale);
  return i - stale - misses;
}

// Entry value once a miss is given `evict_slot`: an out-of-range slot (long-
// lived state corrupted from outside) resolves invalid instead of becoming a
// hot-cache or ownership write.
HS_HD int32_t miss_entry(int32_t evict_slot, int64_t region_stride) {
  return slot_in_region(evict_slot, region_stride) ? (kTagMiss | evict_slot)
                                                   : kTagInvalid;
}

HS_HD bool entry_resolved(int32_t entry) {
  return entry != kUnresolved && (entry & kTagMask) != 0;
}

// What one reference to a resolved entry publishes and how it is counted.
struct Reference {
  int32_t slot;  // -1: publish -1
  bool hit;      // counted in stats[0]
  bool miss;     // counted in stats[1] and flagged in miss_mask
};

HS_HD Reference reference_outcome(int32_t entry, bool first_reference) {
  if (entry & kTagInvalid) return Reference{-1, false, false};
  const bool miss = (entry & kTagMiss) != 0 && first_reference;
  return Reference{entry & kSlotBits, !miss, miss};
}

// Per-row share of a run's compact swap plan (rows of one request fill
// consecutive top-k segments).
HS_HD int32_t swap_count_for_row(int32_t total_misses, int32_t row_in_run,
                                 int32_t top_k) {
  const int64_t left = static_cast<int64_t>(total_misses) -
                       static_cast<int64_t>(row_in_run) * top_k;
  return static_cast<int32_t>(left < 0 ? 0 : (left > top_k ? top_k : left));
}

// ---- gathers -------------------------------------------------------------------

enum GatherAction : int32_t { kGatherSkip = 0, kGatherCopy = 1, kGatherZero = 2 };

// g >= host_rows has no source row: the slot is zeroed rather than left stale.
HS_HD GatherAction gather_action(int32_t g, int32_t dst, int64_t host_rows,
                                 int64_t hot_rows) {
  if (g < 0 || dst < 0 || dst >= hot_rows) return kGatherSkip;
  return g < host_rows ? kGatherCopy : kGatherZero;
}

HS_HD int32_t compact_count(int32_t miss_count, int32_t top_k) {
  return miss_count < 0 ? 0 : (miss_count > top_k ? top_k : miss_count);
}

// ---- invalidation ----------------------------------------------------------------

// State row whose copies of `written_slot` must be dropped; -1: none.
HS_HD int32_t invalidation_state(int32_t request, int64_t num_requests,
                                 const int32_t* request_state_indices,
                                 int64_t num_state_rows, int64_t written_slot) {
  if (request < 0 || request >= num_requests) return -1;
  const int32_t state = request_state_indices[request];
  if (state < 0 || state >= num_state_rows || written_slot < 0) return -1;
  return state;
}

}  // namespace hisparse

// Raw-pointer parameter blocks of the four ops and the tensor checks they
// share, used by the CPU and CUDA implementations (hisparse_checks.h builds
// the blocks from tensors).
#pragma once

#include <cstdint>
#include <optional>

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include "hisparse_logic.h"

namespace hisparse {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;
using OptTensor = std::optional<Tensor>;

enum class Device { kCpu, kCuda };

inline bool on_device(const Tensor& t, Device device) {
  return device == Device::kCuda ? t.is_cuda() : t.is_cpu();
}

inline const char* device_name(Device device) {
  return device == Device::kCuda ? "CUDA" : "CPU";
}

// The hot cache and every index tensor live on `device`; the host pool is
// always CPU memory (pinned for the CUDA path: checked there).
struct ResolveParams {
  const int32_t* hot_table;
  int64_t hot_table_stride;
  int32_t hot_block_size;
  const int32_t* global_indices;
  int64_t input_row_stride;
  const int32_t* request_ids;
  SourceMap map;
  const int32_t* request_state_indices;
  int32_t request_state_count;
  int32_t* hot_indices;
  int32_t* attention_indices;
  int64_t attention_row_stride;
  int64_t attention_block_stride;
  int32_t* miss_mask;
  int32_t* resolved_global_indices;
  int32_t* valid_counts;
  int64_t valid_count_stride;
  int32_t* swap_host_rows;
  int32_t* swap_device_rows;
  int32_t* swap_counts;
  uint64_t* stats;
  int32_t* device_global_indices;
  int16_t* lru_slots;
  int64_t region_stride;
  int32_t hot_size;
  int32_t num_rows;
  int32_t top_k;
  int32_t max_union_rows;
  int32_t table_capacity;  // union table buckets: see union_table_size
};

struct GatherParams {
  const char* host_cache;
  char* hot_cache;
  int64_t host_rows;
  int64_t hot_rows;
  int64_t row_bytes;
  int64_t hot_block_stride_bytes;
  int32_t hot_block_size;
  int32_t num_rows;
  int32_t top_k;
  // gather_plan
  const int32_t* global_indices;
  const int32_t* hot_indices;
  const int32_t* miss_mask;
  const int32_t* request_state_indices;
  int32_t* attention_indices;
  int64_t attention_block_stride;
  // gather_compact
  const int32_t* miss_counts;
};

struct InvalidateParams {
  int32_t* device_global_indices;
  const int32_t* request_state_indices;
  const int32_t* req_id_per_token;
  const int64_t* written_slots;
  int64_t num_tokens;
  int64_t num_requests;
  int64_t num_state_rows;
  int64_t region_stride;
};

inline bool is_int32(const Tensor& t) { return t.scalar_type() == ScalarType::Int; }

inline int64_t row_bytes_of(const Tensor& t) {
  return t.size(t.dim() - 1) * static_cast<int64_t>(t.element_size());
}

// Host pool: 2-D, contiguous, rows as wide as the hot cache's.
inline int64_t check_host_cache(const Tensor& host_cache, int64_t row_bytes) {
  STD_TORCH_CHECK(host_cache.is_cpu(), "host_cache must be CPU memory");
  STD_TORCH_CHECK(host_cache.dim() == 2 && host_cache.is_contiguous(),
                  "host_cache must be a contiguous 2D tensor");
  STD_TORCH_CHECK(row_bytes_of(host_cache) == row_bytes,
                  "host_cache rows are ", row_bytes_of(host_cache),
                  " bytes, the hot cache's ", row_bytes);
  return host_cache.size(0);
}

// Hot cache: paged [blocks, block_size, width] (or a [rows, width] staging
// buffer where allowed), rows contiguous and 16-byte multiples.
struct HotLayout {
  int64_t row_bytes;
  int32_t block_size;
  int64_t block_stride_bytes;
  int64_t rows;
};

inline HotLayout check_hot_cache(const Tensor& hot_cache, Device device,
                                 bool allow_staging) {
  STD_TORCH_CHECK(on_device(hot_cache, device), "hot_cache must be on ",
                  device_name(device));
  const int64_t dim = hot_cache.dim();
  STD_TORCH_CHECK(dim == 3 || (allow_staging && dim == 2),
                  allow_staging ? "hot_cache must be a 2D staging buffer or a paged 3D cache"
                                : "hot_cache must be [num_blocks, block_size, row_width]");
  HotLayout out{};
  out.row_bytes = row_bytes_of(hot_cache);
  STD_TORCH_CHECK(out.row_bytes % 16 == 0, "KV rows must be multiples of 16 bytes, got ",
                  out.row_bytes);
  STD_TORCH_CHECK(hot_cache.stride(dim - 1) == 1 &&
                      hot_cache.stride(dim - 2) * static_cast<int64_t>(hot_cache.element_size()) ==
                          out.row_bytes,
                  "hot-cache rows must be contiguous");
  out.block_size = dim == 3 ? static_cast<int32_t>(hot_cache.size(1)) : 1;
  out.block_stride_bytes = hot_cache.stride(0) * static_cast<int64_t>(hot_cache.element_size());
  out.rows = hot_cache.size(0) * out.block_size;
  return out;
}

inline const int32_t* opt_int32_ptr(const OptTensor& t) {
  return t.has_value() ? t->const_data_ptr<int32_t>() : nullptr;
}

}  // namespace hisparse

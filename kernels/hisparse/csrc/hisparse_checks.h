// Argument checks of the four ops, building their parameter blocks: the ops'
// contract (shapes, dtypes, contiguity, hot-size bounds). Shared by the CPU and
// CUDA implementations; only "which device" differs, so it is a parameter.
#pragma once

#include "hisparse_params.h"

namespace hisparse {

inline ResolveParams make_resolve_params(
    Device device, const Tensor& host_cache, const Tensor& hot_cache,
    const Tensor& hot_block_table, const Tensor& global_indices, const Tensor& hot_indices,
    const Tensor& device_global_indices, const Tensor& lru_slots,
    const OptTensor& request_state_indices, int64_t region_stride, int64_t max_union_rows,
    const OptTensor& miss_mask, const OptTensor& stats, const OptTensor& attention_indices,
    int64_t attention_block_stride, const OptTensor& request_ids,
    const OptTensor& source_block_table, int64_t source_block_size,
    const OptTensor& resolved_global_indices, const OptTensor& valid_counts,
    const OptTensor& swap_host_physical_rows, const OptTensor& swap_device_physical_rows,
    const OptTensor& swap_counts, const OptTensor& resident_block_table,
    int64_t resident_block_size, int64_t resident_null_block) {
  const HotLayout hot = check_hot_cache(hot_cache, device, /*allow_staging=*/false);
  const int64_t host_rows = check_host_cache(host_cache, hot.row_bytes);
  auto same_device = [&](const Tensor& t) { return on_device(t, device); };
  STD_TORCH_CHECK(same_device(hot_block_table) && is_int32(hot_block_table) &&
                      hot_block_table.dim() == 2 && hot_block_table.stride(1) == 1,
                  "hot_block_table must be a row-major 2D int32 tensor on ", device_name(device));
  STD_TORCH_CHECK(same_device(global_indices) && same_device(hot_indices) &&
                      same_device(device_global_indices) && same_device(lru_slots),
                  "index tensors must be on ", device_name(device));
  STD_TORCH_CHECK(is_int32(global_indices) && is_int32(hot_indices) &&
                      is_int32(device_global_indices),
                  "global_indices, hot_indices and device_global_indices must be int32");
  STD_TORCH_CHECK(lru_slots.scalar_type() == ScalarType::Short, "lru_slots must be int16");
  STD_TORCH_CHECK(global_indices.dim() == 2 && global_indices.stride(1) == 1,
                  "global_indices must be row-major 2D");
  const int64_t num_rows = global_indices.size(0);
  const int64_t top_k = global_indices.size(1);
  STD_TORCH_CHECK(num_rows <= INT32_MAX, "too many rows for one launch");
  STD_TORCH_CHECK(hot_indices.dim() == 2 && hot_indices.size(0) == num_rows &&
                      hot_indices.size(1) == top_k && hot_indices.is_contiguous(),
                  "hot_indices must be contiguous and shaped like global_indices");
  STD_TORCH_CHECK(device_global_indices.dim() == 2 && device_global_indices.is_contiguous(),
                  "device_global_indices must be contiguous 2D");
  STD_TORCH_CHECK(lru_slots.dim() == 2 && lru_slots.is_contiguous() &&
                      lru_slots.size(0) == device_global_indices.size(0),
                  "lru_slots must be contiguous with one row per request state");
  const int64_t hot_size = lru_slots.size(1);
  STD_TORCH_CHECK(hot_size >= top_k, "hot buffer size ", hot_size, " is below top_k ", top_k);
  STD_TORCH_CHECK(hot_size <= kMaxHotSize, "hot buffer size ", hot_size,
                  " does not fit int16 slots");
  STD_TORCH_CHECK(region_stride == hot_size, "region_stride ", region_stride,
                  " must equal the LRU size ", hot_size);
  STD_TORCH_CHECK(device_global_indices.size(1) == region_stride,
                  "device_global_indices must cover the whole hot region");
  STD_TORCH_CHECK(hot_block_table.size(1) >= (region_stride + hot.block_size - 1) / hot.block_size,
                  "hot_block_table has too few columns for the hot region");
  STD_TORCH_CHECK(hot.rows < INT32_MAX, "hot cache rows must fit int32");

  ResolveParams p{};
  p.hot_table = hot_block_table.const_data_ptr<int32_t>();
  p.hot_table_stride = hot_block_table.stride(0);
  p.hot_block_size = hot.block_size;
  p.global_indices = global_indices.const_data_ptr<int32_t>();
  p.input_row_stride = global_indices.stride(0);
  p.map.host_rows = host_rows;

  STD_TORCH_CHECK(request_ids.has_value() == source_block_table.has_value(),
                  "request_ids and source_block_table go together");
  if (source_block_table.has_value()) {
    const Tensor& req = *request_ids;
    const Tensor& table = *source_block_table;
    STD_TORCH_CHECK(same_device(req) && is_int32(req) && req.is_contiguous() &&
                        req.numel() >= num_rows,
                    "request_ids must be contiguous int32 with one entry per row");
    STD_TORCH_CHECK(same_device(table) && is_int32(table) && table.dim() == 2 &&
                        table.stride(1) == 1,
                    "source_block_table must be a row-major 2D int32 tensor");
    STD_TORCH_CHECK(source_block_size > 0, "source_block_size must be positive");
    p.request_ids = req.const_data_ptr<int32_t>();
    p.map.source_table = table.const_data_ptr<int32_t>();
    p.map.source_stride = table.stride(0);
    p.map.source_rows = static_cast<int32_t>(table.size(0));
    p.map.source_cols = static_cast<int32_t>(table.size(1));
    p.map.source_block_size = static_cast<int32_t>(source_block_size);
  }
  const int64_t hot_table_rows_needed = p.request_ids != nullptr ? p.map.source_rows : num_rows;
  STD_TORCH_CHECK(hot_block_table.size(0) >= hot_table_rows_needed,
                  "hot_block_table has too few rows");

  if (resident_block_table.has_value()) {
    const Tensor& table = *resident_block_table;
    STD_TORCH_CHECK(source_block_table.has_value(),
                    "resident_block_table needs request_ids and source_block_table");
    STD_TORCH_CHECK(same_device(table) && is_int32(table) && table.dim() == 2 &&
                        table.stride(1) == 1,
                    "resident_block_table must be a row-major 2D int32 tensor");
    STD_TORCH_CHECK(resident_block_size == hot.block_size,
                    "resident block size ", resident_block_size, " differs from the hot ",
                    hot.block_size);
    STD_TORCH_CHECK(resident_null_block >= 0, "resident_null_block must be non-negative");
    p.map.resident_table = table.const_data_ptr<int32_t>();
    p.map.resident_stride = table.stride(0);
    p.map.resident_rows = static_cast<int32_t>(table.size(0));
    p.map.resident_cols = static_cast<int32_t>(table.size(1));
    p.map.resident_block_size = static_cast<int32_t>(resident_block_size);
    p.map.resident_null_block = static_cast<int32_t>(resident_null_block);
  }

  auto row_output = [&](const OptTensor& t, const char* name) -> int32_t* {
    if (!t.has_value()) return nullptr;
    STD_TORCH_CHECK(same_device(*t) && is_int32(*t) && t->dim() == 2 && t->is_contiguous() &&
                        t->size(0) == num_rows && t->size(1) == top_k,
                    name, " must be contiguous int32 shaped like global_indices");
    return t->mutable_data_ptr<int32_t>();
  };
  p.resolved_global_indices = row_output(resolved_global_indices, "resolved_global_indices");
  p.miss_mask = row_output(miss_mask, "miss_mask");

  if (valid_counts.has_value()) {
    const Tensor& counts = *valid_counts;
    STD_TORCH_CHECK(same_device(counts) && is_int32(counts) && counts.dim() == 1 &&
                        counts.size(0) == num_rows,
                    "valid_counts must be int32 with one entry per row");
    p.valid_counts = counts.mutable_data_ptr<int32_t>();
    p.valid_count_stride = counts.stride(0);
  }

  const bool swaps = swap_host_physical_rows.has_value();
  STD_TORCH_CHECK(swaps == swap_device_physical_rows.has_value() &&
                      swaps == swap_counts.has_value(),
                  "the three compact swap tensors go together");
  if (swaps) {
    p.swap_host_rows = row_output(swap_host_physical_rows, "swap_host_physical_rows");
    p.swap_device_rows = row_output(swap_device_physical_rows, "swap_device_physical_rows");
    const Tensor& counts = *swap_counts;
    STD_TORCH_CHECK(same_device(counts) && is_int32(counts) && counts.is_contiguous() &&
                        counts.numel() >= num_rows,
                    "swap_counts must be contiguous int32 with one entry per row");
    p.swap_counts = counts.mutable_data_ptr<int32_t>();
  }

  if (request_state_indices.has_value()) {
    const Tensor& states = *request_state_indices;
    STD_TORCH_CHECK(same_device(states) && is_int32(states) && states.dim() == 1 &&
                        states.is_contiguous() && states.numel() <= INT32_MAX,
                    "request_state_indices must be contiguous 1D int32");
    p.request_state_indices = states.const_data_ptr<int32_t>();
    p.request_state_count = static_cast<int32_t>(states.numel());
  } else {
    STD_TORCH_CHECK(device_global_indices.size(0) >= num_rows,
                    "device_global_indices has fewer state rows than launch rows");
  }

  if (stats.has_value()) {
    const Tensor& st = *stats;
    STD_TORCH_CHECK(same_device(st) && st.is_contiguous() && st.dim() == 1 &&
                        st.scalar_type() == ScalarType::UInt64 && st.numel() == 2,
                    "stats must be a contiguous two-element uint64 tensor");
    p.stats = static_cast<uint64_t*>(st.mutable_data_ptr());
  }

  if (attention_indices.has_value()) {
    const Tensor& att = *attention_indices;
    STD_TORCH_CHECK(same_device(att) && is_int32(att) && att.dim() == 2 &&
                        att.stride(1) == 1 && att.size(0) == num_rows && att.size(1) == top_k,
                    "attention_indices must be row-major int32 shaped like global_indices");
    STD_TORCH_CHECK(attention_block_stride >= hot.block_size,
                    "attention_block_stride must cover one hot block");
    p.attention_indices = att.mutable_data_ptr<int32_t>();
    p.attention_row_stride = att.stride(0);
  }
  p.attention_block_stride = attention_block_stride;

  p.hot_indices = hot_indices.mutable_data_ptr<int32_t>();
  p.device_global_indices = device_global_indices.mutable_data_ptr<int32_t>();
  p.lru_slots = lru_slots.mutable_data_ptr<int16_t>();
  p.region_stride = region_stride;
  p.hot_size = static_cast<int32_t>(hot_size);
  p.num_rows = static_cast<int32_t>(num_rows);
  p.top_k = static_cast<int32_t>(top_k);
  if (num_rows > 0 && top_k > 0) {
    STD_TORCH_CHECK(max_union_rows > 0 && max_union_rows <= hot_size,
                    "max_union_rows must be in [1, hot_size=", hot_size, "], got ",
                    max_union_rows);
  }
  p.max_union_rows = static_cast<int32_t>(max_union_rows);
  p.table_capacity = roomy_union_capacity(p.max_union_rows);
  return p;
}

inline GatherParams make_gather_plan_params(
    Device device, const Tensor& host_cache, const Tensor& hot_cache,
    const Tensor& global_indices, const Tensor& hot_indices, const Tensor& miss_mask,
    const OptTensor& request_state_indices, const OptTensor& attention_indices,
    int64_t attention_block_stride) {
  STD_TORCH_CHECK(on_device(global_indices, device) && on_device(hot_indices, device) &&
                      on_device(miss_mask, device),
                  "plan tensors must be on ", device_name(device));
  STD_TORCH_CHECK(is_int32(global_indices) && is_int32(hot_indices) && is_int32(miss_mask),
                  "plan tensors must be int32");
  STD_TORCH_CHECK(global_indices.dim() == 2 && global_indices.is_contiguous(),
                  "global_indices must be contiguous 2D");
  const int64_t num_rows = global_indices.size(0);
  const int64_t top_k = global_indices.size(1);
  STD_TORCH_CHECK(hot_indices.dim() == 2 && miss_mask.dim() == 2 &&
                      hot_indices.size(0) == num_rows && hot_indices.size(1) == top_k &&
                      miss_mask.size(0) == num_rows && miss_mask.size(1) == top_k &&
                      hot_indices.is_contiguous() && miss_mask.is_contiguous(),
                  "hot_indices and miss_mask must be contiguous and shaped like global_indices");
  const HotLayout hot = check_hot_cache(hot_cache, device, /*allow_staging=*/true);
  GatherParams p{};
  p.host_rows = check_host_cache(host_cache, hot.row_bytes);
  if (request_state_indices.has_value()) {
    const Tensor& states = *request_state_indices;
    STD_TORCH_CHECK(on_device(states, device) && is_int32(states) && states.is_contiguous() &&
                        states.numel() >= num_rows,
                    "request_state_indices must be contiguous int32 with one entry per row");
    p.request_state_indices = states.const_data_ptr<int32_t>();
  }
  if (attention_indices.has_value()) {
    const Tensor& att = *attention_indices;
    STD_TORCH_CHECK(on_device(att, device) && is_int32(att) && att.dim() == 2 &&
                        att.is_contiguous() && att.size(0) == num_rows && att.size(1) == top_k,
                    "attention_indices must be contiguous int32 shaped like global_indices");
    STD_TORCH_CHECK(attention_block_stride >= hot.block_size,
                    "attention_block_stride must cover one hot block");
    p.attention_indices = att.mutable_data_ptr<int32_t>();
  }
  p.host_cache = static_cast<const char*>(host_cache.const_data_ptr());
  p.hot_cache = static_cast<char*>(hot_cache.mutable_data_ptr());
  p.hot_rows = hot.rows;
  p.row_bytes = hot.row_bytes;
  p.hot_block_stride_bytes = hot.block_stride_bytes;
  p.hot_block_size = hot.block_size;
  p.num_rows = static_cast<int32_t>(num_rows);
  p.top_k = static_cast<int32_t>(top_k);
  p.global_indices = global_indices.const_data_ptr<int32_t>();
  p.hot_indices = hot_indices.const_data_ptr<int32_t>();
  p.miss_mask = miss_mask.const_data_ptr<int32_t>();
  p.attention_block_stride = attention_block_stride;
  return p;
}

inline GatherParams make_gather_compact_params(Device device, const Tensor& host_cache,
                                               const Tensor& hot_cache,
                                               const Tensor& miss_global_indices,
                                               const Tensor& miss_hot_indices,
                                               const Tensor& miss_counts) {
  STD_TORCH_CHECK(
      on_device(miss_global_indices, device) && on_device(miss_hot_indices, device) &&
          on_device(miss_counts, device) && is_int32(miss_global_indices) &&
          is_int32(miss_hot_indices) && is_int32(miss_counts) &&
          miss_global_indices.dim() == 2 && miss_hot_indices.dim() == 2 &&
          miss_global_indices.size(0) == miss_hot_indices.size(0) &&
          miss_global_indices.size(1) == miss_hot_indices.size(1) &&
          miss_counts.numel() >= miss_global_indices.size(0) &&
          miss_global_indices.is_contiguous() && miss_hot_indices.is_contiguous() &&
          miss_counts.is_contiguous(),
      "the compact miss plan must be matching contiguous int32 tensors on ",
      device_name(device));
  const HotLayout hot = check_hot_cache(hot_cache, device, /*allow_staging=*/false);
  GatherParams p{};
  p.host_rows = check_host_cache(host_cache, hot.row_bytes);
  p.host_cache = static_cast<const char*>(host_cache.const_data_ptr());
  p.hot_cache = static_cast<char*>(hot_cache.mutable_data_ptr());
  p.hot_rows = hot.rows;
  p.row_bytes = hot.row_bytes;
  p.hot_block_stride_bytes = hot.block_stride_bytes;
  p.hot_block_size = hot.block_size;
  p.num_rows = static_cast<int32_t>(miss_global_indices.size(0));
  p.top_k = static_cast<int32_t>(miss_global_indices.size(1));
  p.global_indices = miss_global_indices.const_data_ptr<int32_t>();
  p.hot_indices = miss_hot_indices.const_data_ptr<int32_t>();
  p.miss_counts = miss_counts.const_data_ptr<int32_t>();
  return p;
}

inline InvalidateParams make_invalidate_params(Device device,
                                               const Tensor& device_global_indices,
                                               const Tensor& request_state_indices,
                                               const Tensor& req_id_per_token,
                                               const Tensor& written_slots) {
  STD_TORCH_CHECK(on_device(device_global_indices, device) &&
                      on_device(request_state_indices, device) &&
                      on_device(req_id_per_token, device) && on_device(written_slots, device),
                  "invalidation tensors must be on ", device_name(device));
  STD_TORCH_CHECK(is_int32(device_global_indices) && device_global_indices.dim() == 2 &&
                      device_global_indices.is_contiguous(),
                  "device_global_indices must be a contiguous 2D int32 tensor");
  STD_TORCH_CHECK(is_int32(request_state_indices) && request_state_indices.dim() == 1 &&
                      request_state_indices.is_contiguous(),
                  "request_state_indices must be a contiguous 1D int32 tensor");
  STD_TORCH_CHECK(is_int32(req_id_per_token) && req_id_per_token.dim() == 1 &&
                      req_id_per_token.is_contiguous(),
                  "req_id_per_token must be a contiguous 1D int32 tensor");
  STD_TORCH_CHECK(written_slots.scalar_type() == ScalarType::Long && written_slots.dim() == 1 &&
                      written_slots.is_contiguous(),
                  "written_slots must be a contiguous 1D int64 tensor");
  STD_TORCH_CHECK(req_id_per_token.numel() == written_slots.numel(),
                  "req_id_per_token and written_slots must have equal length");
  InvalidateParams p{};
  p.device_global_indices = device_global_indices.mutable_data_ptr<int32_t>();
  p.request_state_indices = request_state_indices.const_data_ptr<int32_t>();
  p.req_id_per_token = req_id_per_token.const_data_ptr<int32_t>();
  p.written_slots = written_slots.const_data_ptr<int64_t>();
  p.num_tokens = written_slots.numel();
  p.num_requests = request_state_indices.numel();
  p.num_state_rows = device_global_indices.size(0);
  p.region_stride = device_global_indices.size(1);
  return p;
}

}  // namespace hisparse

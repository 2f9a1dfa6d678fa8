// Drop-in replacement for vLLM's hisparse_kernels.cu (vLLM 0.32/0.33 op set).
//
// A vLLM source build copies this file over vLLM's own and the bundled
// headers into a `hisparse_bundled/` folder beside it; vLLM's binding file
// then registers these four functions under _C_cache_ops exactly as it would
// its own. The kernels are the bundled module's (hisparse_cuda_impl.cuh), so
// a vLLM build and the plugin build run the same code.
#include <cstdint>
#include <optional>

#include <torch/csrc/stable/tensor.h>

#if __has_include("torch_utils.h")
#include "torch_utils.h"
#endif
#if __has_include("ops.h")
// vLLM's declarations of the four functions: a signature drift shows up here.
#include "ops.h"
#endif

#include "hisparse_bundled/hisparse_cuda_impl.cuh"

namespace {
using hisparse::Device;
using OptTensor = std::optional<torch::stable::Tensor>;
}  // namespace

void hisparse_invalidate_written_slots(torch::stable::Tensor& device_global_indices,
                                       torch::stable::Tensor const& request_state_indices,
                                       torch::stable::Tensor const& req_id_per_token,
                                       torch::stable::Tensor const& written_slots) {
  const auto p = hisparse::make_invalidate_params(Device::kCuda, device_global_indices,
                                                  request_state_indices, req_id_per_token,
                                                  written_slots);
  hisparse::invalidate_written_slots_cuda(p, device_global_indices.get_device_index());
}

void hisparse_resolve_residency(
    torch::stable::Tensor const& host_cache, torch::stable::Tensor& hot_cache,
    torch::stable::Tensor const& hot_block_table, torch::stable::Tensor const& global_indices,
    torch::stable::Tensor& hot_indices, torch::stable::Tensor& device_global_indices,
    torch::stable::Tensor& lru_slots, OptTensor const& request_state_indices,
    int64_t region_stride, int64_t max_union_rows, OptTensor const& miss_mask,
    OptTensor const& stats, OptTensor const& attention_indices, int64_t attention_block_stride,
    OptTensor const& request_ids, OptTensor const& source_block_table, int64_t source_block_size,
    OptTensor const& resolved_global_indices, OptTensor const& valid_counts,
    OptTensor const& swap_host_physical_rows, OptTensor const& swap_device_physical_rows,
    OptTensor const& swap_counts, OptTensor const& resident_block_table,
    int64_t resident_block_size, int64_t resident_null_block) {
  const auto p = hisparse::make_resolve_params(
      Device::kCuda, host_cache, hot_cache, hot_block_table, global_indices, hot_indices,
      device_global_indices, lru_slots, request_state_indices, region_stride, max_union_rows,
      miss_mask, stats, attention_indices, attention_block_stride, request_ids,
      source_block_table, source_block_size, resolved_global_indices, valid_counts,
      swap_host_physical_rows, swap_device_physical_rows, swap_counts, resident_block_table,
      resident_block_size, resident_null_block);
  hisparse::resolve_residency_cuda(p, hot_cache.get_device_index(), host_cache);
}

void hisparse_gather_plan(torch::stable::Tensor const& host_cache,
                          torch::stable::Tensor& hot_cache,
                          torch::stable::Tensor const& global_indices,
                          torch::stable::Tensor const& hot_indices,
                          torch::stable::Tensor const& miss_mask,
                          OptTensor const& request_state_indices,
                          OptTensor const& attention_indices, int64_t attention_block_stride) {
  const auto p = hisparse::make_gather_plan_params(Device::kCuda, host_cache, hot_cache,
                                                   global_indices, hot_indices, miss_mask,
                                                   request_state_indices, attention_indices,
                                                   attention_block_stride);
  hisparse::gather_plan_cuda(p, hot_cache.get_device_index(), host_cache);
}

void hisparse_gather_compact(torch::stable::Tensor const& host_cache,
                             torch::stable::Tensor& hot_cache,
                             torch::stable::Tensor const& miss_global_indices,
                             torch::stable::Tensor const& miss_hot_indices,
                             torch::stable::Tensor const& miss_counts) {
  const auto p = hisparse::make_gather_compact_params(Device::kCuda, host_cache, hot_cache,
                                                      miss_global_indices, miss_hot_indices,
                                                      miss_counts);
  hisparse::gather_compact_cuda(p, hot_cache.get_device_index(), host_cache);
}

// Drop-in replacement for vLLM's hisparse_kernels.cu (vLLM 0.32/0.33 op set).
//
// A vLLM source build copies this file over vLLM's own and the bundled
// headers into a `hisparse_bundled/` folder beside it; vLLM's binding file
// then registers these four functions under _C_cache_ops exactly as it would
// its own. The kernels are the bundled module's (hisparse_cuda_impl.cuh), so
// a vLLM build and the plugin build run the same code.
//
// Signatures: where vLLM's ops.h sits beside this file it is included, and
// the checks at the end of this file fail the compile unless each of the four
// names denotes exactly one function, of the type vLLM declares (a differing
// declaration would otherwise just add an overload, and vLLM would fail only
// at import, on an undefined symbol). The harness's compile check builds this
// file with vllm_hisparse_ops.h (vLLM 0.32/0.33's declarations) as that ops.h.
#include <cstdint>
#include <optional>
#include <type_traits>

#include <torch/csrc/stable/tensor.h>

#if __has_include("torch_utils.h")
#include "torch_utils.h"
#endif
#if __has_include("ops.h")
#include "ops.h"  // vLLM's declarations of the four functions
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
  hisparse::cuda::launch_invalidate_written_slots(p, device_global_indices.get_device_index());
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
  hisparse::cuda::launch_resolve_residency(p, hot_cache.get_device_index(), host_cache);
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
  hisparse::cuda::launch_gather_plan(p, hot_cache.get_device_index(), host_cache);
}

void hisparse_gather_compact(torch::stable::Tensor const& host_cache,
                             torch::stable::Tensor& hot_cache,
                             torch::stable::Tensor const& miss_global_indices,
                             torch::stable::Tensor const& miss_hot_indices,
                             torch::stable::Tensor const& miss_counts) {
  const auto p = hisparse::make_gather_compact_params(Device::kCuda, host_cache, hot_cache,
                                                      miss_global_indices, miss_hot_indices,
                                                      miss_counts);
  hisparse::cuda::launch_gather_compact(p, hot_cache.get_device_index(), host_cache);
}

// ---- signature checks ---------------------------------------------------------
// decltype(&name) does not compile when `name` is overloaded: that is the
// error a drifted declaration in ops.h produces here. The types below are
// vLLM 0.32/0.33's (vllm_hisparse_ops.h; schemas in docs/facts.md §9).
namespace hisparse_dropin_signatures {
using T = torch::stable::Tensor;
using O = std::optional<torch::stable::Tensor>;
using Resolve = void(T const&, T&, T const&, T const&, T&, T&, T&, O const&, int64_t, int64_t,
                     O const&, O const&, O const&, int64_t, O const&, O const&, int64_t, O const&,
                     O const&, O const&, O const&, O const&, O const&, int64_t, int64_t);
using Invalidate = void(T&, T const&, T const&, T const&);
using Plan = void(T const&, T&, T const&, T const&, T const&, O const&, O const&, int64_t);
using Compact = void(T const&, T&, T const&, T const&, T const&);
static_assert(std::is_same_v<decltype(&::hisparse_resolve_residency), Resolve*>,
              "hisparse_resolve_residency: not vLLM's signature");
static_assert(std::is_same_v<decltype(&::hisparse_invalidate_written_slots), Invalidate*>,
              "hisparse_invalidate_written_slots: not vLLM's signature");
static_assert(std::is_same_v<decltype(&::hisparse_gather_plan), Plan*>,
              "hisparse_gather_plan: not vLLM's signature");
static_assert(std::is_same_v<decltype(&::hisparse_gather_compact), Compact*>,
              "hisparse_gather_compact: not vLLM's signature");
}  // namespace hisparse_dropin_signatures

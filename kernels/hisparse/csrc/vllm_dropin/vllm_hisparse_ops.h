// vLLM's C++ declarations of the four HiSparse functions (vLLM 0.32/0.33,
// torch stable ABI), as its binding file registers them under _C_cache_ops
// with the schemas of docs/facts.md §9 (a `Tensor` argument is a
// `Tensor const&`, `Tensor!` a `Tensor&`, an optional one an
// `std::optional<Tensor> const&`, `int` an `int64_t`).
//
// Not compiled into anything vLLM ships: the harness's compile check
// (harness/builds/kernel_proofs.py) puts this file beside the drop-in as
// `ops.h`, where a vLLM source tree has its own, so the drop-in is compiled
// against these declarations; the drop-in's signature checks then fail the
// compile if its definitions differ from them (see hisparse_kernels.cu).
// tests/test_dropin_signatures.py checks these lines against the schemas.
#pragma once

#include <cstdint>
#include <optional>

#include <torch/csrc/stable/tensor.h>

void hisparse_resolve_residency(
    torch::stable::Tensor const& host_cache, torch::stable::Tensor& hot_cache,
    torch::stable::Tensor const& hot_block_table, torch::stable::Tensor const& global_indices,
    torch::stable::Tensor& hot_indices, torch::stable::Tensor& device_global_indices,
    torch::stable::Tensor& lru_slots,
    std::optional<torch::stable::Tensor> const& request_state_indices, int64_t region_stride,
    int64_t max_union_rows, std::optional<torch::stable::Tensor> const& miss_mask,
    std::optional<torch::stable::Tensor> const& stats,
    std::optional<torch::stable::Tensor> const& attention_indices, int64_t attention_block_stride,
    std::optional<torch::stable::Tensor> const& request_ids,
    std::optional<torch::stable::Tensor> const& source_block_table, int64_t source_block_size,
    std::optional<torch::stable::Tensor> const& resolved_global_indices,
    std::optional<torch::stable::Tensor> const& valid_counts,
    std::optional<torch::stable::Tensor> const& swap_host_physical_rows,
    std::optional<torch::stable::Tensor> const& swap_device_physical_rows,
    std::optional<torch::stable::Tensor> const& swap_counts,
    std::optional<torch::stable::Tensor> const& resident_block_table, int64_t resident_block_size,
    int64_t resident_null_block);

void hisparse_invalidate_written_slots(torch::stable::Tensor& device_global_indices,
                                       torch::stable::Tensor const& request_state_indices,
                                       torch::stable::Tensor const& req_id_per_token,
                                       torch::stable::Tensor const& written_slots);

void hisparse_gather_plan(torch::stable::Tensor const& host_cache, torch::stable::Tensor& hot_cache,
                          torch::stable::Tensor const& global_indices,
                          torch::stable::Tensor const& hot_indices,
                          torch::stable::Tensor const& miss_mask,
                          std::optional<torch::stable::Tensor> const& request_state_indices,
                          std::optional<torch::stable::Tensor> const& attention_indices,
                          int64_t attention_block_stride);

void hisparse_gather_compact(torch::stable::Tensor const& host_cache,
                             torch::stable::Tensor& hot_cache,
                             torch::stable::Tensor const& miss_global_indices,
                             torch::stable::Tensor const& miss_hot_indices,
                             torch::stable::Tensor const& miss_counts);

// Entry points of the CPU and CUDA implementations, on checked parameter
// blocks (hisparse_params.h builds them from tensors).
#pragma once

#include "hisparse_checks.h"

namespace hisparse {

void resolve_residency_cpu(const ResolveParams& p);
void gather_plan_cpu(const GatherParams& p);
void gather_compact_cpu(const GatherParams& p);
void invalidate_written_slots_cpu(const InvalidateParams& p);

#if defined(HISPARSE_WITH_CUDA)
// device_index: the hot cache's GPU; host_cache: checked to be pinned.
void resolve_residency_cuda(const ResolveParams& p, int32_t device_index,
                            const Tensor& host_cache);
void gather_plan_cuda(const GatherParams& p, int32_t device_index, const Tensor& host_cache);
void gather_compact_cuda(const GatherParams& p, int32_t device_index, const Tensor& host_cache);
void invalidate_written_slots_cuda(const InvalidateParams& p, int32_t device_index);
#endif

}  // namespace hisparse

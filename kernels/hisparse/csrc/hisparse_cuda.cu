// The module's CUDA translation unit: the kernels and their (inline) launchers
// come from the shared header; this file defines the four entry points that
// registration.cpp declares (hisparse_ops.h) and registers for CUDA.
#include "hisparse_ops.h"
#include "hisparse_cuda_impl.cuh"

namespace hisparse {

void resolve_residency_cuda(const ResolveParams& p, int32_t device_index,
                            const Tensor& host_cache) {
  cuda::launch_resolve_residency(p, device_index, host_cache);
}

void gather_plan_cuda(const GatherParams& p, int32_t device_index, const Tensor& host_cache) {
  cuda::launch_gather_plan(p, device_index, host_cache);
}

void gather_compact_cuda(const GatherParams& p, int32_t device_index, const Tensor& host_cache) {
  cuda::launch_gather_compact(p, device_index, host_cache);
}

void invalidate_written_slots_cuda(const InvalidateParams& p, int32_t device_index) {
  cuda::launch_invalidate_written_slots(p, device_index);
}

}  // namespace hisparse

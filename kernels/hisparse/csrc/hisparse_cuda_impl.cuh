// CUDA kernels and launchers of the four HiSparse ops. Included by exactly
// one translation unit per build (the module's hisparse_cuda.cu, or the vLLM
// drop-in), so both builds run the same code. Per-entry rules come from
// hisparse_logic.h, shared with the CPU build.
//
// Everything here is a kernel or an inline function: the launchers
// (cuda::launch_*) have no external definition of their own; the module's
// hisparse_cuda.cu wraps them in the entry points hisparse_ops.h declares, and
// the vLLM drop-in calls them from vLLM's four functions.
//
// Launch shapes: the resolver runs one 1,024-thread block per request run
// (the rows of one request share its hot state and are resolved as a union),
// with shared memory sized from max_union_rows and the hot size; gather_plan
// 1,024 threads, one lane per plan entry, each warp copying the rows of 32
// entries with their loads batched ahead of their stores (column groups
// spread over enough blocks to fill the GPU); gather_compact the same with 512
// threads; invalidation 256 threads a token.
#pragma once

#include "hisparse_cuda_common.cuh"
#include "hisparse_cuda_copy.cuh"
#include "hisparse_cuda_resolve.cuh"

// CUDA kernels and launchers of the four HiSparse ops. Included by exactly
// one translation unit per build (the module's hisparse_cuda.cu, or the vLLM
// drop-in), so both builds run the same code. Per-entry rules come from
// hisparse_logic.h, shared with the CPU build.
//
// Launch shapes: the resolver runs one 1,024-thread block per request run
// (the rows of one request share its hot state and are resolved as a union),
// with shared memory sized from max_union_rows and the hot size; gather_plan
// one warp per column (1,024 threads, columns spread over enough blocks to
// fill the GPU); gather_compact 512 threads; invalidation 256 threads a token.
#pragma once

#include "hisparse_cuda_common.cuh"
#include "hisparse_cuda_copy.cuh"
#include "hisparse_cuda_resolve.cuh"

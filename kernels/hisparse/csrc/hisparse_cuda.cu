// The module's CUDA translation unit: kernels and launchers come from the
// shared header; registration.cpp registers them (CUDA dispatch key).
#include "hisparse_ops.h"
#include "hisparse_cuda_impl.cuh"

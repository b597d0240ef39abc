/*
 * pdl.cu — the switch of programmatic dependent launch (common.cuh: rlk_launch,
 * pdl_wait, pdl_trigger).  Off until the backend turns it on: lib/compute/ops_cuda.c sets it
 * on a GPU of compute capability 9.0 or more unless RL_CUDA_PDL=0.  Process-wide, as
 * the kernels' other options.
 */
#include "kernels/common.cuh"
#include "kernels/launch.h"

extern "C" int rlk_pdl_on = 0;

extern "C" void
rlk_set_pdl(int on)
{
	rlk_pdl_on = on != 0;
}

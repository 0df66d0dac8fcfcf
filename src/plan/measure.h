#pragma once
// Measuring this machine's cpu-local hardware profile (`longctx plan
// --measure`, and train's quick one for context_parallel_strategy=auto):
// real kernels on random data and real transfers between the ranks.
#include "comm/communicator.h"
#include "plan/hardware.h"

namespace longctx {

// Collective over `world`; every rank returns the same profile (each number
// the slowest rank's). With one rank there is nothing to time between ranks:
// the link numbers are placeholders (a one-rank plan has no communication).
// quick: smaller problems and fewer repetitions (a few seconds).
HardwareProfile measure_cpu_local_profile(const Communicator& world, bool quick);

}  // namespace longctx

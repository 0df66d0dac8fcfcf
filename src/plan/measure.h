#pragma once
// Measuring this machine's cpu-local hardware profile (`longctx plan
// --measure`, and train's quick one for context_parallel_strategy=auto):
// real kernels on random data and real transfers between the ranks.
#include "comm/communicator.h"
#include "core/config.h"
#include "plan/hardware.h"

namespace longctx {

// Collective over `world`; every rank returns the same profile (each number
// the slowest rank's). With one rank there is nothing to time between ranks:
// the link numbers are placeholders (a one-rank plan has no communication).
// full: `plan --measure`; quick: smaller problems and fewer repetitions (a
// few seconds: train's auto); smoke: the smallest problems, once each: it
// proves every measurement runs on this CPU (CI under emulation,
// scripts/qemu_smoke.sh), its numbers are no profile to plan a run with.
enum class MeasureSize { full, quick, smoke };
HardwareProfile measure_cpu_local_profile(const Communicator& world, MeasureSize size);

// Before anything is allocated: refuses (ConfigError naming both numbers, on
// every rank) a run whose predicted peak per rank (predicted_memory_bytes)
// exceeds device_memory_budget, or this host's memory shared by the ranks
// on it (MemTotal / ranks on this host). Collective over `world`.
void require_memory_fits(const RunConfig& config, const Communicator& world);

}  // namespace longctx

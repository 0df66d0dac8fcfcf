#pragma once
// Shared by the training tests: the one-process mesh, the losses of a few
// steps, a directory every rank of the job names alike, relative differences.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "comm/communicator.h"
#include "train/trainer.h"

namespace longctx::test {

// One process, no MPI: the same code path as many ranks.
inline const Mesh& one_rank() {
  static const Mesh mesh = Mesh::single();
  return mesh;
}

struct RunResult {
  double loss0 = 0, grad_norm0 = 0, loss_last = 0;
};

// Step 1's loss and gradient norm, and the loss after `steps`.
inline RunResult train(const RunConfig& c, const Mesh& mesh, int steps) {
  Trainer t(c, mesh);
  RunResult r;
  const StepMetrics m = t.train_step();
  r.loss0 = m.loss;
  r.grad_norm0 = m.grad_norm;
  for (int i = 1; i < steps; ++i) r.loss_last = t.train_step().loss;
  return r;
}

// One directory name for all ranks of the job: rank 0's pid names it.
inline std::filesystem::path shared_temp_dir(const std::string& prefix) {
  long long id = comm_world_rank() == 0 ? static_cast<long long>(::getpid()) : 0;
  Communicator::world("temp dir").broadcast(&id, sizeof id, 0);
  return std::filesystem::temp_directory_path() / (prefix + std::to_string(id));
}

inline double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

}  // namespace longctx::test

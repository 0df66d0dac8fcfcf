#include "comm/mesh.h"

#include "core/error.h"

namespace longctx {

std::string MeshShape::to_string() const {
  return "dp=" + std::to_string(dp) + " cp=" + std::to_string(cp) + " (ulysses=" +
         std::to_string(ulysses) + " x ring=" + std::to_string(ring()) + ") tp=" +
         std::to_string(tp);
}

void validate_mesh(const MeshShape& s, int world_size) {
  if (s.dp < 1 || s.cp < 1 || s.ulysses < 1 || s.tp < 1)
    throw ConfigError("mesh: every axis must be >= 1, got dp=" + std::to_string(s.dp) +
                      " cp=" + std::to_string(s.cp) + " ulysses=" + std::to_string(s.ulysses) +
                      " tp=" + std::to_string(s.tp));
  if (s.cp % s.ulysses != 0)
    throw ConfigError("mesh: the ulysses degree (" + std::to_string(s.ulysses) +
                      ") must divide the context parallelism cp (" + std::to_string(s.cp) + ")");
  if (s.world() != world_size)
    throw ConfigError("mesh: dp x cp x tp = " + std::to_string(s.dp) + " x " +
                      std::to_string(s.cp) + " x " + std::to_string(s.tp) + " = " +
                      std::to_string(s.world()) + " but the job has " +
                      std::to_string(world_size) + " ranks");
}

namespace {

// color selects the group; ranks are ordered by key inside it.
Communicator split(const Communicator& parent, int color, int key, const std::string& name) {
  MPI_Comm c;
  MPI_Comm_split(parent.raw(), color, key, &c);
  return Communicator(c, name);
}

int checked_world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace

Mesh::Mesh(const MeshShape& shape)
    : shape_((validate_mesh(shape, checked_world_size()), shape)),
      world_(Communicator::world("world")),
      dp_(MPI_COMM_NULL, ""),
      cp_(MPI_COMM_NULL, ""),
      ulysses_(MPI_COMM_NULL, ""),
      ring_(MPI_COMM_NULL, ""),
      tp_(MPI_COMM_NULL, ""),
      replicas_(MPI_COMM_NULL, "") {
  const int U = shape_.ulysses, R = shape_.ring(), T = shape_.tp;
  int r = world_.rank();
  tp_rank_ = r % T;
  ulysses_rank_ = (r / T) % U;
  ring_rank_ = (r / (T * U)) % R;
  dp_rank_ = r / (T * U * R);
  cp_rank_ = ring_rank_ * U + ulysses_rank_;
  // Color = the coordinates that stay fixed inside the group.
  dp_ = split(world_, cp_rank_ * T + tp_rank_, dp_rank_, "dp");
  cp_ = split(world_, dp_rank_ * T + tp_rank_, cp_rank_, "cp");
  ulysses_ = split(world_, (dp_rank_ * R + ring_rank_) * T + tp_rank_, ulysses_rank_, "ulysses");
  ring_ = split(world_, (dp_rank_ * U + ulysses_rank_) * T + tp_rank_, ring_rank_, "ring");
  tp_ = split(world_, dp_rank_ * shape_.cp + cp_rank_, tp_rank_, "tp");
  replicas_ = split(world_, tp_rank_, dp_rank_ * shape_.cp + cp_rank_, "replicas");
}

CommCounters Mesh::total_counters() const {
  CommCounters total;
  for (const Communicator* c : {&world_, &dp_, &cp_, &ulysses_, &ring_, &tp_, &replicas_})
    total += c->counters();
  return total;
}

void Mesh::reset_counters() const {
  for (const Communicator* c : {&world_, &dp_, &cp_, &ulysses_, &ring_, &tp_, &replicas_})
    c->reset_counters();
}

}  // namespace longctx

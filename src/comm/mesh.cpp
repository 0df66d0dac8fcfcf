#include "comm/mesh.h"

#include <utility>

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

Mesh::Mesh(const MeshShape& shape) : Mesh(shape, Communicator::world("world")) {}

Mesh Mesh::single() { return Mesh(MeshShape{}, Communicator::single("world")); }

// Color = the coordinates that stay fixed inside the group; key = the rank in it.
Mesh::Mesh(const MeshShape& shape, Communicator world)
    : shape_((validate_mesh(shape, world.size()), shape)),
      tp_rank_(world.rank() % shape.tp),
      ulysses_rank_((world.rank() / shape.tp) % shape.ulysses),
      ring_rank_((world.rank() / (shape.tp * shape.ulysses)) % shape.ring()),
      dp_rank_(world.rank() / (shape.tp * shape.ulysses * shape.ring())),
      cp_rank_(ring_rank_ * shape.ulysses + ulysses_rank_),
      world_(std::move(world)),
      dp_(world_.split(cp_rank_ * shape_.tp + tp_rank_, dp_rank_, "dp")),
      cp_(world_.split(dp_rank_ * shape_.tp + tp_rank_, cp_rank_, "cp")),
      ulysses_(world_.split((dp_rank_ * shape_.ring() + ring_rank_) * shape_.tp + tp_rank_, ulysses_rank_,
                            "ulysses")),
      ring_(world_.split((dp_rank_ * shape_.ulysses + ulysses_rank_) * shape_.tp + tp_rank_, ring_rank_, "ring")),
      tp_(world_.split(dp_rank_ * shape_.cp + cp_rank_, tp_rank_, "tp")),
      replicas_(world_.split(tp_rank_, dp_rank_ * shape_.cp + cp_rank_, "replicas")) {}

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

#include "comm/mesh.h"

#include <utility>

#include "core/error.h"

namespace longctx {

std::string MeshShape::to_string() const {
  return "dp=" + std::to_string(dp) + (fsdp > 1 || fsdp_over_context ? " fsdp=" + std::to_string(fsdp) : "") +
         " cp=" + std::to_string(cp) + " (ulysses=" + std::to_string(ulysses) + " x ring=" + std::to_string(ring()) +
         ") tp=" + std::to_string(tp) + (fsdp_over_context ? " (fsdp over context)" : "");
}

void validate_mesh(const MeshShape& s, int world_size) {
  if (s.dp < 1 || s.fsdp < 1 || s.cp < 1 || s.ulysses < 1 || s.tp < 1)
    throw ConfigError("mesh: every axis must be >= 1, got dp=" + std::to_string(s.dp) + " fsdp=" +
                      std::to_string(s.fsdp) + " cp=" + std::to_string(s.cp) + " ulysses=" +
                      std::to_string(s.ulysses) + " tp=" + std::to_string(s.tp));
  if (s.cp % s.ulysses != 0)
    throw ConfigError("mesh: the ulysses degree (" + std::to_string(s.ulysses) +
                      ") must divide the context parallelism cp (" + std::to_string(s.cp) + ")");
  if (s.world() != world_size)
    throw ConfigError("mesh: dp x fsdp x cp x tp = " + std::to_string(s.dp) + " x " + std::to_string(s.fsdp) +
                      " x " + std::to_string(s.cp) + " x " + std::to_string(s.tp) + " = " +
                      std::to_string(s.world()) + " but the job has " + std::to_string(world_size) + " ranks");
}

Mesh::Mesh(const MeshShape& shape) : Mesh(shape, Communicator::world("world")) {}

Mesh Mesh::single() { return Mesh(MeshShape{}, Communicator::single("world")); }

namespace {
// Position along the dp x fsdp x cp x tp grid, as a color: the coordinates
// named stay fixed inside a group (the others are set to 0 by the caller).
int grid(const MeshShape& s, int dp, int fsdp, int cp, int tp) { return ((dp * s.fsdp + fsdp) * s.cp + cp) * s.tp + tp; }
}  // namespace

// Color = the coordinates that stay fixed inside the group; key = the rank in it.
Mesh::Mesh(const MeshShape& shape, Communicator world)
    : shape_((validate_mesh(shape, world.size()), shape)),
      tp_rank_(world.rank() % shape.tp),
      ulysses_rank_((world.rank() / shape.tp) % shape.ulysses),
      ring_rank_((world.rank() / (shape.tp * shape.ulysses)) % shape.ring()),
      fsdp_rank_((world.rank() / (shape.tp * shape.cp)) % shape.fsdp),
      dp_rank_(world.rank() / (shape.tp * shape.cp * shape.fsdp)),
      cp_rank_(ring_rank_ * shape.ulysses + ulysses_rank_),
      world_(std::move(world)),
      dp_(world_.split(grid(shape_, 0, fsdp_rank_, cp_rank_, tp_rank_), dp_rank_, "dp")),
      cp_(world_.split(grid(shape_, dp_rank_, fsdp_rank_, 0, tp_rank_), cp_rank_, "cp")),
      ulysses_(world_.split(grid(shape_, dp_rank_, fsdp_rank_, ring_rank_ * shape_.ulysses, tp_rank_), ulysses_rank_,
                            "ulysses")),
      ring_(world_.split(grid(shape_, dp_rank_, fsdp_rank_, ulysses_rank_, tp_rank_), ring_rank_, "ring")),
      tp_(world_.split(grid(shape_, dp_rank_, fsdp_rank_, cp_rank_, 0), tp_rank_, "tp")),
      shards_(shape_.fsdp_over_context
                  ? world_.split(grid(shape_, dp_rank_, 0, 0, tp_rank_), fsdp_rank_ * shape_.cp + cp_rank_, "shards")
                  : world_.split(grid(shape_, dp_rank_, 0, cp_rank_, tp_rank_), fsdp_rank_, "shards")),
      replicas_(shape_.fsdp_over_context
                    ? world_.split(grid(shape_, 0, fsdp_rank_, cp_rank_, tp_rank_), dp_rank_, "replicas")
                    : world_.split(grid(shape_, 0, fsdp_rank_, 0, tp_rank_), dp_rank_ * shape_.cp + cp_rank_,
                                   "replicas")),
      data_(world_.split(tp_rank_, (dp_rank_ * shape_.fsdp + fsdp_rank_) * shape_.cp + cp_rank_, "data")) {}

std::array<const Communicator*, 9> Mesh::all() const {
  return {&world_, &dp_, &cp_, &ulysses_, &ring_, &tp_, &shards_, &replicas_, &data_};
}

CommCounters Mesh::total_counters() const {
  CommCounters total;
  for (const Communicator* c : all()) total += c->counters();
  return total;
}

void Mesh::reset_counters() const {
  for (const Communicator* c : all()) c->reset_counters();
}

}  // namespace longctx

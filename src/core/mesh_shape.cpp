#include "core/mesh_shape.h"

#include "core/error.h"

namespace longctx {

const char* mesh_axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::world: return "world";
    case MeshAxis::dp: return "dp";
    case MeshAxis::cp: return "cp";
    case MeshAxis::ulysses: return "ulysses";
    case MeshAxis::ring: return "ring";
    case MeshAxis::tp: return "tp";
    case MeshAxis::shards: return "shards";
    case MeshAxis::replicas: return "replicas";
    case MeshAxis::data: return "data";
  }
  return "?";
}

std::string MeshShape::to_string() const {
  return "dp=" + std::to_string(dp) + (fsdp > 1 || fsdp_over_context ? " fsdp=" + std::to_string(fsdp) : "") +
         " cp=" + std::to_string(cp) + " (ulysses=" + std::to_string(ulysses) + " x ring=" + std::to_string(ring()) +
         ") tp=" + std::to_string(tp) + (fsdp_over_context ? " (fsdp over context)" : "");
}

MeshCoords MeshShape::coords(int world_rank) const {
  MeshCoords c;
  c.world = world_rank;
  c.tp = world_rank % tp;
  c.ulysses = (world_rank / tp) % ulysses;
  c.ring = (world_rank / (tp * ulysses)) % ring();
  c.fsdp = (world_rank / (tp * cp)) % fsdp;
  c.dp = world_rank / (tp * cp * fsdp);
  c.cp = c.ring * ulysses + c.ulysses;
  return c;
}

int MeshShape::group_size(MeshAxis axis) const {
  switch (axis) {
    case MeshAxis::world: return world();
    case MeshAxis::dp: return dp;
    case MeshAxis::cp: return cp;
    case MeshAxis::ulysses: return ulysses;
    case MeshAxis::ring: return ring();
    case MeshAxis::tp: return tp;
    case MeshAxis::shards: return shard_group();
    case MeshAxis::replicas: return replicas();
    case MeshAxis::data: return data_ranks();
  }
  return 0;
}

int MeshShape::rank_in(MeshAxis axis, const MeshCoords& c) const {
  switch (axis) {
    case MeshAxis::world: return c.world;
    case MeshAxis::dp: return c.dp;
    case MeshAxis::cp: return c.cp;
    case MeshAxis::ulysses: return c.ulysses;
    case MeshAxis::ring: return c.ring;
    case MeshAxis::tp: return c.tp;
    case MeshAxis::shards: return fsdp_over_context ? c.fsdp * cp + c.cp : c.fsdp;
    case MeshAxis::replicas: return fsdp_over_context ? c.dp : c.dp * cp + c.cp;
    case MeshAxis::data: return (c.dp * fsdp + c.fsdp) * cp + c.cp;
  }
  return 0;
}

int MeshShape::group_of(MeshAxis axis, const MeshCoords& c) const {
  // The position on the dp x fsdp x cp x tp grid with the coordinates that
  // vary inside the group set to 0.
  auto grid = [&](int d, int f, int x, int t) { return ((d * fsdp + f) * cp + x) * tp + t; };
  switch (axis) {
    case MeshAxis::world: return 0;
    case MeshAxis::dp: return grid(0, c.fsdp, c.cp, c.tp);
    case MeshAxis::cp: return grid(c.dp, c.fsdp, 0, c.tp);
    case MeshAxis::ulysses: return grid(c.dp, c.fsdp, c.ring * ulysses, c.tp);
    case MeshAxis::ring: return grid(c.dp, c.fsdp, c.ulysses, c.tp);
    case MeshAxis::tp: return grid(c.dp, c.fsdp, c.cp, 0);
    case MeshAxis::shards: return fsdp_over_context ? grid(c.dp, 0, 0, c.tp) : grid(c.dp, 0, c.cp, c.tp);
    case MeshAxis::replicas: return fsdp_over_context ? grid(0, c.fsdp, c.cp, c.tp) : grid(0, c.fsdp, 0, c.tp);
    case MeshAxis::data: return c.tp;
  }
  return 0;
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

}  // namespace longctx

#include "comm/mesh.h"

#include <utility>

#include "comm/backend.h"
#include "core/error.h"

namespace longctx {

Mesh::Mesh(const MeshShape& shape) : Mesh(shape, Communicator::world("world")) {}

Mesh Mesh::single() { return Mesh(MeshShape{}, Communicator::single("world")); }

// Each group: the world's ranks with equal group_of, ranked by rank_in.
Mesh::Mesh(const MeshShape& shape, Communicator world)
    : Mesh((validate_mesh(shape, world.size()), shape), world.rank()) {
  comms_.push_back(std::move(world));
  for (MeshAxis a : kMeshAxes)
    if (a != MeshAxis::world)
      comms_.push_back(comms_[0].split(shape_.group_of(a, at_), shape_.rank_in(a, at_), mesh_axis_name(a)));
}

Mesh Mesh::counting(const MeshShape& shape, int world_rank) {
  validate_mesh(shape, shape.world());
  if (world_rank < 0 || world_rank >= shape.world())
    throw ConfigError("counting mesh: rank " + std::to_string(world_rank) + " of a mesh of " +
                      std::to_string(shape.world()) + " ranks (" + shape.to_string() + ")");
  Mesh m(shape, world_rank);
  for (MeshAxis a : kMeshAxes)
    m.comms_.emplace_back(make_counting_backend(shape.rank_in(a, m.at_), shape.group_size(a)), mesh_axis_name(a));
  return m;
}

CommCounters Mesh::total_counters() const {
  CommCounters total;
  for (const Communicator& c : comms_) total += c.counters();
  return total;
}

void Mesh::reset_counters() const {
  for (const Communicator& c : comms_) c.reset_counters();
}

}  // namespace longctx

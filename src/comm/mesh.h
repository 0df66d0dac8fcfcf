#pragma once
// The device mesh: one communicator per group of the geometry that
// src/core/mesh_shape.h owns (world = dp x fsdp x cp x tp, cp = ulysses x
// ring; which ranks form each group, and why).
//
// Strategies all_gather and ulysses use cp() as one group; ring uses ring()
// (all of cp: its ulysses factor is 1), usp ulysses() for its all-to-all and
// ring() for its ring, so a ring's traffic is counted on the ring axis either way.
//
// Construction is collective over the world communicator (Communicator::world:
// every rank of the job, or this process alone when MPI was never started).
// Mesh::single() is the 1x1x1x1 mesh of this process alone, with no MPI at
// all: one-rank runs and unit tests take the same code path as many ranks.
// Mesh::counting(shape, rank) stands for one rank of a mesh of any size in
// this process alone: its communicators move no bytes but count every
// operation as that rank of the full mesh would (src/comm/backend.h).
// The Mesh must outlive every object (e.g. a CpAttention) that uses its
// communicators.
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/mesh_shape.h"

namespace longctx {

class Mesh {
 public:
  // Collective over Communicator::world(); validates first (every rank throws the same error).
  explicit Mesh(const MeshShape& shape);
  Mesh(int dp, int cp, int ulysses, int tp) : Mesh(MeshShape{dp, cp, ulysses, tp}) {}
  // Over the ranks of `world` (collective over it); its sub-communicators come from world.split.
  Mesh(const MeshShape& shape, Communicator world);
  // This process alone (Communicator::single), whether or not MPI runs.
  static Mesh single();
  // Rank `world_rank` of `shape`, in this process alone, on counting
  // communicators (make_counting_backend): no MPI, no bytes moved.
  static Mesh counting(const MeshShape& shape, int world_rank);

  const MeshShape& shape() const { return shape_; }
  const MeshCoords& coords() const { return at_; }
  int world_rank() const { return at_.world; }
  int dp_rank() const { return at_.dp; }
  int fsdp_rank() const { return at_.fsdp; }
  // Which slice of the global batch this rank reads (dp * fsdp slices).
  int data_rank() const { return at_.dp * shape_.fsdp + at_.fsdp; }
  int cp_rank() const { return at_.cp; }
  int ulysses_rank() const { return at_.ulysses; }
  int ring_rank() const { return at_.ring; }
  int tp_rank() const { return at_.tp; }

  const Communicator& axis(MeshAxis a) const { return comms_[static_cast<int>(a)]; }
  const Communicator& world() const { return axis(MeshAxis::world); }
  const Communicator& dp() const { return axis(MeshAxis::dp); }
  const Communicator& cp() const { return axis(MeshAxis::cp); }
  const Communicator& ulysses() const { return axis(MeshAxis::ulysses); }
  const Communicator& ring() const { return axis(MeshAxis::ring); }
  const Communicator& tp() const { return axis(MeshAxis::tp); }
  const Communicator& shards() const { return axis(MeshAxis::shards); }
  const Communicator& replicas() const { return axis(MeshAxis::replicas); }
  const Communicator& data() const { return axis(MeshAxis::data); }

  // Sum of the counters of every communicator above (world included).
  CommCounters total_counters() const;
  void reset_counters() const;

 private:
  Mesh(const MeshShape& shape, int world_rank) : shape_(shape), at_(shape.coords(world_rank)) {}
  MeshShape shape_;
  MeshCoords at_;
  std::vector<Communicator> comms_;  // one per MeshAxis, in kMeshAxes order
};

}  // namespace longctx

#pragma once
// The device mesh: world = dp x cp x tp, with cp = ulysses x ring.
//
// Rank order (world rank), tp fastest, then ulysses, then ring, then dp:
//   world_rank = ((dp_rank * ring + ring_rank) * ulysses + ulysses_rank) * tp + tp_rank
//   cp_rank    = ring_rank * ulysses + ulysses_rank
// so tensor-parallel peers are neighbours (cheapest links), and the ulysses
// ranks of one ring position are adjacent.
//
// Sub-communicators (each rank is in exactly one of each kind):
//   dp()        same (cp_rank, tp_rank), varying dp_rank          size dp
//   cp()        same (dp_rank, tp_rank), varying cp_rank          size cp  (rank = cp_rank)
//   ulysses()   same (dp, ring, tp), varying ulysses_rank         size ulysses
//   ring()      same (dp, ulysses, tp), varying ring_rank         size ring
//   tp()        same (dp, cp), varying tp_rank                    size tp
//   replicas()  same tp_rank: every rank holding the same parameter
//               shard (dp x cp); gradients are all-reduced here     size dp*cp
//               (reduce-scattered with shard_optimizer_over_data)
//
// Strategies all_gather, ulysses and ring use cp() as one group; usp uses
// ulysses() for its all-to-all and ring() for its ring.
//
// Construction is collective over the world communicator (Communicator::world:
// every rank of the job, or this process alone when MPI was never started).
// Mesh::single() is the 1x1x1x1 mesh of this process alone, with no MPI at
// all: one-rank runs and unit tests take the same code path as many ranks.
// The Mesh must outlive every object (e.g. a CpAttention) that uses its
// communicators.
#include <string>

#include "comm/communicator.h"

namespace longctx {

struct MeshShape {
  int dp = 1;
  int cp = 1;       // ici_context_parallelism
  int ulysses = 1;  // ici_context_usp_ulysses_parallelism; must divide cp
  int tp = 1;       // ici_tensor_parallelism
  int ring() const { return ulysses > 0 ? cp / ulysses : 0; }
  int world() const { return dp * cp * tp; }
  std::string to_string() const;  // "dp=1 cp=4 (ulysses=2 x ring=2) tp=1"
};

// Throws ConfigError naming the sizes when an axis is < 1, ulysses does not
// divide cp, or dp * cp * tp != world_size.
void validate_mesh(const MeshShape& shape, int world_size);

class Mesh {
 public:
  // Collective over Communicator::world(); validates first (every rank throws the same error).
  explicit Mesh(const MeshShape& shape);
  Mesh(int dp, int cp, int ulysses, int tp) : Mesh(MeshShape{dp, cp, ulysses, tp}) {}
  // Over the ranks of `world` (collective over it); its sub-communicators come from world.split.
  Mesh(const MeshShape& shape, Communicator world);
  // This process alone (Communicator::single), whether or not MPI runs.
  static Mesh single();

  const MeshShape& shape() const { return shape_; }
  int world_rank() const { return world_.rank(); }
  int dp_rank() const { return dp_rank_; }
  int cp_rank() const { return cp_rank_; }
  int ulysses_rank() const { return ulysses_rank_; }
  int ring_rank() const { return ring_rank_; }
  int tp_rank() const { return tp_rank_; }

  const Communicator& world() const { return world_; }
  const Communicator& dp() const { return dp_; }
  const Communicator& cp() const { return cp_; }
  const Communicator& ulysses() const { return ulysses_; }
  const Communicator& ring() const { return ring_; }
  const Communicator& tp() const { return tp_; }
  const Communicator& replicas() const { return replicas_; }

  // Sum of the counters of every sub-communicator above (world included).
  CommCounters total_counters() const;
  void reset_counters() const;

 private:
  MeshShape shape_;
  // In this order: each is computed from the ones before it.
  int tp_rank_ = 0, ulysses_rank_ = 0, ring_rank_ = 0, dp_rank_ = 0, cp_rank_ = 0;
  Communicator world_, dp_, cp_, ulysses_, ring_, tp_, replicas_;
};

}  // namespace longctx

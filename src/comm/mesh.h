#pragma once
// The device mesh: world = dp x fsdp x cp x tp, with cp = ulysses x ring.
//
// Rank order (world rank), tp fastest, then ulysses, then ring, then fsdp, then dp:
//   world_rank = (((dp_rank * fsdp + fsdp_rank) * ring + ring_rank) * ulysses + ulysses_rank) * tp + tp_rank
//   cp_rank    = ring_rank * ulysses + ulysses_rank
// so tensor-parallel peers are neighbours (cheapest links), and the ulysses
// ranks of one ring position are adjacent.
//
// dp and fsdp both split the batch (data_rank = dp_rank * fsdp + fsdp_rank);
// they differ in what the ranks hold. FSDP ranks hold 1/fsdp of every
// parameter, its gradient and AdamW moments (src/model/sharded_parameters.h);
// with fsdp_over_context the cp ranks, which hold the same weights and see
// other tokens of the same sequences, shard them too: the shard group is then
// fsdp x cp. dp ranks hold full replicas of their shard.
//
// Sub-communicators (each rank is in exactly one of each kind):
//   dp()        same (fsdp, cp, tp), varying dp_rank              size dp
//   cp()        same (dp, fsdp, tp), varying cp_rank              size cp  (rank = cp_rank)
//   ulysses()   same (dp, fsdp, ring, tp), varying ulysses_rank   size ulysses
//   ring()      same (dp, fsdp, ulysses, tp), varying ring_rank   size ring
//   tp()        same (dp, fsdp, cp), varying tp_rank              size tp
//   shards()    the parameter shard group: same (dp, tp), varying fsdp_rank
//               (and cp_rank with fsdp_over_context)              size fsdp (x cp)
//   replicas()  ranks holding the same parameter shard: same tp rank and
//               shard; gradients are all-reduced here (reduce-scattered
//               with shard_optimizer_over_data)                   size dp (x cp without fsdp_over_context)
//   data()      same tp_rank: every rank of another slice of the batch; loss
//               sums are reduced here                             size dp*fsdp*cp
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
#include <array>
#include <string>

#include "comm/communicator.h"

namespace longctx {

struct MeshShape {
  int dp = 1;
  int cp = 1;       // ici_context_parallelism
  int ulysses = 1;  // ici_context_usp_ulysses_parallelism; must divide cp
  int tp = 1;       // ici_tensor_parallelism
  int fsdp = 1;     // ici_fsdp_parallelism
  bool fsdp_over_context = false;  // the cp ranks shard the parameters too
  int ring() const { return ulysses > 0 ? cp / ulysses : 0; }
  int world() const { return dp * fsdp * cp * tp; }
  int shard_group() const { return fsdp * (fsdp_over_context ? cp : 1); }
  std::string to_string() const;  // "dp=1 fsdp=2 cp=4 (ulysses=2 x ring=2) tp=1"
};

// Throws ConfigError naming the sizes when an axis is < 1, ulysses does not
// divide cp, or dp * fsdp * cp * tp != world_size.
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
  int fsdp_rank() const { return fsdp_rank_; }
  // Which slice of the global batch this rank reads (dp * fsdp slices).
  int data_rank() const { return dp_rank_ * shape_.fsdp + fsdp_rank_; }
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
  const Communicator& shards() const { return shards_; }
  const Communicator& replicas() const { return replicas_; }
  const Communicator& data() const { return data_; }

  // Sum of the counters of every sub-communicator above (world included).
  CommCounters total_counters() const;
  void reset_counters() const;

 private:
  MeshShape shape_;
  // In this order: each is computed from the ones before it.
  int tp_rank_ = 0, ulysses_rank_ = 0, ring_rank_ = 0, fsdp_rank_ = 0, dp_rank_ = 0, cp_rank_ = 0;
  Communicator world_, dp_, cp_, ulysses_, ring_, tp_, shards_, replicas_, data_;
  std::array<const Communicator*, 9> all() const;
};

}  // namespace longctx

#pragma once
// The mesh's geometry, without any communicator: world = dp x fsdp x cp x tp,
// with cp = ulysses x ring. The one place that says which ranks form each
// group, for the Mesh that builds communicators from it (src/comm/mesh.h),
// the counting mesh that stands for one rank of it (Mesh::counting), config
// validation and the planner.
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
// Groups (each rank is in exactly one of each kind):
//   dp        same (fsdp, cp, tp), varying dp_rank              size dp
//   cp        same (dp, fsdp, tp), varying cp_rank              size cp
//   ulysses   same (dp, fsdp, ring, tp), varying ulysses_rank   size ulysses
//   ring      same (dp, fsdp, ulysses, tp), varying ring_rank   size ring
//   tp        same (dp, fsdp, cp), varying tp_rank              size tp
//   shards    the parameter shard group: same (dp, tp), varying fsdp_rank
//             (and cp_rank with fsdp_over_context)              size fsdp (x cp)
//   replicas  ranks holding the same parameter shard: same tp rank and
//             shard; gradients are all-reduced here (reduce-scattered
//             with shard_optimizer_over_data)                   size dp (x cp without fsdp_over_context)
//   data      same tp_rank: every rank of another slice of the batch; loss
//             sums are reduced here                             size dp*fsdp*cp
#include <array>
#include <string>

namespace longctx {

enum class MeshAxis { world, dp, cp, ulysses, ring, tp, shards, replicas, data };
constexpr std::array<MeshAxis, 9> kMeshAxes = {MeshAxis::world, MeshAxis::dp,     MeshAxis::cp,
                                               MeshAxis::ulysses, MeshAxis::ring, MeshAxis::tp,
                                               MeshAxis::shards, MeshAxis::replicas, MeshAxis::data};
const char* mesh_axis_name(MeshAxis a);  // "dp", "shards", ...

// One rank's position on every axis.
struct MeshCoords {
  int world = 0, dp = 0, fsdp = 0, ring = 0, ulysses = 0, tp = 0;
  int cp = 0;  // ring * ulysses + ulysses
};

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
  int replicas() const { return dp * (fsdp_over_context ? 1 : cp); }
  int batch_slices() const { return dp * fsdp; }  // ranks that read different sequences of a batch
  int data_ranks() const { return dp * fsdp * cp; }

  MeshCoords coords(int world_rank) const;
  // The number of ranks in each group of `axis`, a rank's place in its
  // group (0 .. size - 1), and a number equal for the ranks of one group
  // and different between groups.
  int group_size(MeshAxis axis) const;
  int rank_in(MeshAxis axis, const MeshCoords& at) const;
  int group_of(MeshAxis axis, const MeshCoords& at) const;
  std::string to_string() const;  // "dp=1 fsdp=2 cp=4 (ulysses=2 x ring=2) tp=1"
};

// Throws ConfigError naming the sizes when an axis is < 1, ulysses does not
// divide cp, or dp * fsdp * cp * tp != world_size.
void validate_mesh(const MeshShape& shape, int world_size);

}  // namespace longctx

#pragma once
// What a transport implements under a Communicator (src/comm/communicator.h).
// The Communicator adds everything common to all transports on top: the
// watchdog, the byte counters and wait seconds, the names in messages. A
// backend only posts operations and says whether they have completed.
//
// Backends: src/comm/mpi_backend.cpp (the only file that includes MPI's header),
// src/comm/single_backend.cpp (one process, no MPI) and
// src/comm/counting_backend.cpp (one rank of a group that is not there).
#include <cstddef>
#include <memory>
#include <string>

namespace longctx {

// One posted operation. A backend whose operation completed while being
// posted returns nullptr instead of a PendingOp.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual bool test() = 0;    // true once complete; never blocks
  virtual void cancel() = 0;  // cancels and completes it (error paths)
  virtual void wait() = 0;    // blocks, unwatched: an abandoned Request's destructor
};

enum class ElemType { f32, f64, i64 };  // declared in communicator.h too
enum class ReduceOp { sum, max, min };

class CommBackend {
 public:
  virtual ~CommBackend() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective: the ranks with equal color form a group, ordered by key.
  virtual std::unique_ptr<CommBackend> split(int color, int key) const = 0;
  // Collective: the same ranks in the same order.
  virtual std::unique_ptr<CommBackend> duplicate() const { return split(0, rank()); }
  // Which host rank `rank` of this group runs on (host name and address),
  // for messages; "" where unknown (one process).
  virtual std::string host_of(int rank) const { return ""; }

  virtual std::unique_ptr<PendingOp> isend(const void* data, size_t bytes, int dest, int tag) = 0;
  virtual std::unique_ptr<PendingOp> irecv(void* data, size_t bytes, int source, int tag) = 0;
  virtual std::unique_ptr<PendingOp> all_gather(const void* send, void* recv, size_t bytes_per_rank) = 0;
  virtual std::unique_ptr<PendingOp> all_to_all(const void* send, void* recv, size_t bytes_per_rank) = 0;
  virtual std::unique_ptr<PendingOp> reduce_scatter_sum(const float* send, float* recv, size_t count_per_rank) = 0;
  // In place.
  virtual std::unique_ptr<PendingOp> all_reduce(void* data, size_t count, ElemType type, ReduceOp op) = 0;
  virtual std::unique_ptr<PendingOp> broadcast(void* data, size_t bytes, int root) = 0;
  virtual std::unique_ptr<PendingOp> barrier() = 0;
};

// A duplicate of the MPI world (src/comm/mpi_backend.cpp); needs comm_init.
std::unique_ptr<CommBackend> make_mpi_world_backend();
// This process alone: rank 0 of 1 (src/comm/single_backend.cpp).
std::unique_ptr<CommBackend> make_single_backend();
// Rank `rank` of a group of `size` that exists only in name: every operation
// completes as it is posted and moves no bytes (receive buffers are left as
// they are), so the Communicator above counts each call and its bytes as
// that rank of a real group would (its byte conventions, communicator.h).
// For counting what the engine sends without running its peers (Mesh::counting).
// split is refused (a group cannot know its absent members' colors; build
// groups from MeshShape); duplicate is the same group.
std::unique_ptr<CommBackend> make_counting_backend(int rank, int size);

}  // namespace longctx

// The MPI transport of src/comm/communicator.h: the only file of the project
// that includes <mpi.h>. Every operation is posted non-blocking; the
// Communicator completes it through MpiOp::test (its watched wait).
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "comm/backend.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace longctx {

namespace {

int checked_count(size_t bytes) {
  if (bytes > static_cast<size_t>(INT_MAX))
    throw ShapeError("communicator: one message of " + std::to_string(bytes) +
                     " bytes exceeds MPI's 2^31-1 count limit");
  return static_cast<int>(bytes);
}

MPI_Datatype mpi_type(ElemType t) {
  switch (t) {
    case ElemType::f32: return MPI_FLOAT;
    case ElemType::f64: return MPI_DOUBLE;
    case ElemType::i64: return MPI_INT64_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

size_t elem_bytes(ElemType t) { return t == ElemType::f32 ? 4 : 8; }

class MpiOp final : public PendingOp {
 public:
  MPI_Request req = MPI_REQUEST_NULL;
  ~MpiOp() override {
    // Dropped while active (a Request overwritten by another): MPI still
    // completes the transfer; only the handle goes.
    if (req != MPI_REQUEST_NULL) MPI_Request_free(&req);
  }
  bool test() override {
    int done = 0;
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    return done != 0;
  }
  void cancel() override {
    MPI_Cancel(&req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
  void wait() override { MPI_Wait(&req, MPI_STATUS_IGNORE); }
};

class MpiBackend final : public CommBackend {
 public:
  explicit MpiBackend(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiBackend() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<CommBackend> split(int color, int key) const override {
    MPI_Comm c;
    MPI_Comm_split(comm_, color, key, &c);
    return std::make_unique<MpiBackend>(c);
  }

  std::unique_ptr<PendingOp> isend(const void* data, size_t bytes, int dest, int tag) override {
    auto op = std::make_unique<MpiOp>();
    MPI_Isend(data, checked_count(bytes), MPI_BYTE, dest, tag, comm_, &op->req);
    return op;
  }
  std::unique_ptr<PendingOp> irecv(void* data, size_t bytes, int source, int tag) override {
    auto op = std::make_unique<MpiOp>();
    MPI_Irecv(data, checked_count(bytes), MPI_BYTE, source, tag, comm_, &op->req);
    return op;
  }
  std::unique_ptr<PendingOp> all_gather(const void* send, void* recv, size_t bytes_per_rank) override {
    auto op = std::make_unique<MpiOp>();
    // This rank's block already in place: MPI forbids aliasing it as the send buffer.
    const bool in_place = send == static_cast<const char*>(recv) + static_cast<size_t>(rank_) * bytes_per_rank;
    MPI_Iallgather(in_place ? MPI_IN_PLACE : send, checked_count(bytes_per_rank), MPI_BYTE, recv,
                   checked_count(bytes_per_rank), MPI_BYTE, comm_, &op->req);
    return op;
  }
  std::unique_ptr<PendingOp> all_to_all(const void* send, void* recv, size_t bytes_per_rank) override {
    auto op = std::make_unique<MpiOp>();
    MPI_Ialltoall(send, checked_count(bytes_per_rank), MPI_BYTE, recv, checked_count(bytes_per_rank), MPI_BYTE,
                  comm_, &op->req);
    return op;
  }
  std::unique_ptr<PendingOp> reduce_scatter_sum(const float* send, float* recv, size_t count_per_rank) override {
    auto op = std::make_unique<MpiOp>();
    checked_count(count_per_rank * 4 * size_);
    MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count_per_rank), MPI_FLOAT, MPI_SUM, comm_, &op->req);
    return op;
  }
  std::unique_ptr<PendingOp> all_reduce(void* data, size_t count, ElemType type, ReduceOp reduce) override {
    auto op = std::make_unique<MpiOp>();
    const int e = static_cast<int>(elem_bytes(type));
    MPI_Iallreduce(MPI_IN_PLACE, data, checked_count(count * e) / e, mpi_type(type), mpi_op(reduce), comm_,
                   &op->req);
    return op;
  }
  std::unique_ptr<PendingOp> broadcast(void* data, size_t bytes, int root) override {
    auto op = std::make_unique<MpiOp>();
    MPI_Ibcast(data, checked_count(bytes), MPI_BYTE, root, comm_, &op->req);
    return op;
  }
  std::unique_ptr<PendingOp> barrier() override {
    auto op = std::make_unique<MpiOp>();
    MPI_Ibarrier(comm_, &op->req);
    return op;
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<CommBackend> make_mpi_world_backend() {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return std::make_unique<MpiBackend>(c);
}

void comm_init(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
}

void comm_finalize() {
  if (comm_initialized()) MPI_Finalize();
}

bool comm_initialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void comm_abort(int code) {
  if (comm_initialized()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

int comm_world_rank() {
  int rank = 0;
  if (comm_initialized()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int comm_world_size() {
  int size = 1;
  if (comm_initialized()) MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

void comm_progress() {
  if (!comm_initialized()) return;
  // Any MPI call runs Open MPI's progress engine; nothing is ever sent on
  // MPI_COMM_SELF, so the probe matches nothing.
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
}

}  // namespace longctx

// The counting transport (backend.h, make_counting_backend): one rank of a
// group whose other members do not exist. Nothing is sent or received; the
// Communicator counts every operation with this group's size.
#include <string>

#include "comm/backend.h"
#include "core/error.h"

namespace longctx {

namespace {

class CountingBackend final : public CommBackend {
 public:
  CountingBackend(int rank, int size) : rank_(rank), size_(size) {
    if (size < 1 || rank < 0 || rank >= size)
      throw Error("counting communicator: rank " + std::to_string(rank) + " of a group of " + std::to_string(size));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<CommBackend> split(int, int) const override {
    throw Error("counting communicator: split needs every rank's color, and the other ranks are not there "
                "(build a counting mesh from its MeshShape: Mesh::counting)");
  }
  std::unique_ptr<CommBackend> duplicate() const override { return std::make_unique<CountingBackend>(rank_, size_); }

  std::unique_ptr<PendingOp> isend(const void*, size_t, int dest, int) override { return peer(dest, "send to"); }
  std::unique_ptr<PendingOp> irecv(void*, size_t, int source, int) override { return peer(source, "receive from"); }
  std::unique_ptr<PendingOp> all_gather(const void*, void*, size_t) override { return nullptr; }
  std::unique_ptr<PendingOp> all_to_all(const void*, void*, size_t) override { return nullptr; }
  std::unique_ptr<PendingOp> reduce_scatter_sum(const float*, float*, size_t) override { return nullptr; }
  std::unique_ptr<PendingOp> all_reduce(void*, size_t, ElemType, ReduceOp) override { return nullptr; }
  std::unique_ptr<PendingOp> broadcast(void*, size_t, int root) override { return peer(root, "broadcast from"); }
  std::unique_ptr<PendingOp> barrier() override { return nullptr; }

 private:
  std::unique_ptr<PendingOp> peer(int r, const char* what) const {
    if (r < 0 || r >= size_)
      throw Error(std::string("counting communicator: ") + what + " rank " + std::to_string(r) + " of a group of " +
                  std::to_string(size_));
    return nullptr;
  }
  int rank_, size_;
};

}  // namespace

std::unique_ptr<CommBackend> make_counting_backend(int rank, int size) {
  return std::make_unique<CountingBackend>(rank, size);
}

}  // namespace longctx

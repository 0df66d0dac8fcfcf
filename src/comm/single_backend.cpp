// The transport of a one-process world (Communicator::single, and
// Communicator::world when MPI was never started): rank 0 of 1. A collective
// of one rank moves only this rank's own block, so each completes while it
// is posted. Messages to oneself are matched here by tag, in posting order,
// as MPI matches them; any other peer is an error.
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "comm/backend.h"
#include "core/error.h"

namespace longctx {

namespace {

void copy(void* to, const void* from, size_t bytes) {
  if (to != from && bytes > 0) std::memmove(to, from, bytes);
}

void check_self(int peer, const char* what) {
  if (peer != 0)
    throw Error(std::string("single-process communicator: ") + what + " rank " + std::to_string(peer) +
                ", but this world has rank 0 only");
}

// A message to oneself: complete once a send and a receive with the same tag meet.
class SelfOp final : public PendingOp {
 public:
  struct Mailbox;
  SelfOp(Mailbox* box, void* data, size_t bytes, int tag, bool is_send)
      : box_(box), data_(data), bytes_(bytes), tag_(tag), is_send_(is_send) {}
  ~SelfOp() override { cancel(); }
  bool test() override;
  void cancel() override;
  void wait() override;

  struct Mailbox {
    std::mutex mu;
    std::deque<SelfOp*> sends, recvs;  // posted, not yet matched
    void post(SelfOp* op);
  };

 private:
  Mailbox* box_;
  void* data_;
  size_t bytes_;
  int tag_;
  bool is_send_;
  bool done_ = false;  // guarded by box_->mu
};

void SelfOp::Mailbox::post(SelfOp* op) {
  std::lock_guard<std::mutex> lock(mu);
  std::deque<SelfOp*>& others = op->is_send_ ? recvs : sends;
  for (auto it = others.begin(); it != others.end(); ++it) {
    SelfOp* other = *it;
    if (other->tag_ != op->tag_) continue;
    SelfOp* s = op->is_send_ ? op : other;
    SelfOp* r = op->is_send_ ? other : op;
    if (s->bytes_ > r->bytes_)
      throw Error("single-process communicator: a message of " + std::to_string(s->bytes_) +
                  " bytes to a receive of " + std::to_string(r->bytes_));
    copy(r->data_, s->data_, s->bytes_);
    s->done_ = r->done_ = true;
    others.erase(it);
    return;
  }
  (op->is_send_ ? sends : recvs).push_back(op);
}

bool SelfOp::test() {
  std::lock_guard<std::mutex> lock(box_->mu);
  return done_;
}

void SelfOp::cancel() {
  std::lock_guard<std::mutex> lock(box_->mu);
  if (done_) return;
  for (auto* q : {&box_->sends, &box_->recvs})
    for (auto it = q->begin(); it != q->end(); ++it)
      if (*it == this) {
        q->erase(it);
        break;
      }
  done_ = true;
}

// Only another thread of this process can still complete it (as MPI would hang).
void SelfOp::wait() {
  while (!test()) std::this_thread::yield();
}

class SingleBackend final : public CommBackend {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::unique_ptr<CommBackend> split(int, int) const override { return std::make_unique<SingleBackend>(); }

  std::unique_ptr<PendingOp> isend(const void* data, size_t bytes, int dest, int tag) override {
    check_self(dest, "send to");
    return post(const_cast<void*>(data), bytes, tag, true);
  }
  std::unique_ptr<PendingOp> irecv(void* data, size_t bytes, int source, int tag) override {
    check_self(source, "receive from");
    return post(data, bytes, tag, false);
  }
  std::unique_ptr<PendingOp> all_gather(const void* send, void* recv, size_t bytes_per_rank) override {
    copy(recv, send, bytes_per_rank);
    return nullptr;
  }
  std::unique_ptr<PendingOp> all_to_all(const void* send, void* recv, size_t bytes_per_rank) override {
    copy(recv, send, bytes_per_rank);
    return nullptr;
  }
  std::unique_ptr<PendingOp> reduce_scatter_sum(const float* send, float* recv, size_t count_per_rank) override {
    copy(recv, send, count_per_rank * sizeof(float));
    return nullptr;
  }
  std::unique_ptr<PendingOp> all_reduce(void*, size_t, ElemType, ReduceOp) override { return nullptr; }
  std::unique_ptr<PendingOp> broadcast(void*, size_t, int root) override {
    check_self(root, "broadcast from");
    return nullptr;
  }
  std::unique_ptr<PendingOp> barrier() override { return nullptr; }

 private:
  std::unique_ptr<PendingOp> post(void* data, size_t bytes, int tag, bool is_send) {
    auto op = std::make_unique<SelfOp>(&mailbox_, data, bytes, tag, is_send);
    mailbox_.post(op.get());
    return op;
  }
  SelfOp::Mailbox mailbox_;
};

}  // namespace

std::unique_ptr<CommBackend> make_single_backend() { return std::make_unique<SingleBackend>(); }

}  // namespace longctx

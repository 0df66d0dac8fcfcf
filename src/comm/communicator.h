#pragma once
// One communicator interface for every transport (src/comm/backend.h), in the
// spirit of MLX's `distributed` group: all_gather, all_to_all,
// reduce_scatter, all_reduce, broadcast, barrier, send/recv, split.
// Backends: MPI (src/comm/mpi_backend.cpp, the only file that sees MPI's header)
// and one process without MPI (src/comm/single_backend.cpp), so that one-rank
// runs and unit tests take the same code path as many ranks.
//
// Every operation is posted non-blocking and completed by one watched wait,
// so that (1) a rank stuck longer than collective_timeout_seconds on one
// operation prints which one and aborts the job instead of hanging, and
// (2) the time a rank spends blocked is measured per operation kind: that is
// the communication a benchmark reports as "exposed" (time hidden behind
// compute never reaches a wait).
//
// Byte counters, per communicator and per operation kind, count the payload
// this rank logically sends to and receives from OTHER ranks (never itself),
// independent of the transport's internal algorithm. With P = size(), n = bytes per rank:
//   send / recv          n to / from the peer
//   all_gather(n)        sent n*(P-1), received n*(P-1)
//   all_to_all(n)        sent n*(P-1), received n*(P-1)   (n = one block)
//   reduce_scatter(n)    sent n*(P-1), received n*(P-1)   (n = one output block)
//   all_reduce(n)        sent 2*n*(P-1)/P, received the same (ring algorithm),
//                        integer division (sum, max and min alike)
//   broadcast(n)         the root sent n*(P-1), received 0; every other rank
//                        sent 0, received n
//   barrier              0
// So a communicator of size 1 counts calls but never a byte.
// The planner (src/plan) reuses these formulas.

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <atomic>

namespace longctx {

enum class CommOp { send, recv, all_gather, all_to_all, reduce_scatter, all_reduce, barrier, broadcast };
constexpr int kNumCommOps = 8;
const char* comm_op_name(CommOp op);

struct CommOpCounters {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  // Sends only: each message's bytes times its distance around the group's
  // ring, min(k, P - k) for a peer k ranks away (the links it crosses on a
  // torus whose ring the ranks follow; the planner's time for ring traffic).
  int64_t hop_bytes = 0;
  double wait_seconds = 0.0;  // time blocked in wait() for this kind
};

struct CommCounters {
  std::array<CommOpCounters, kNumCommOps> op{};
  const CommOpCounters& operator[](CommOp o) const { return op[static_cast<int>(o)]; }
  CommOpCounters& operator[](CommOp o) { return op[static_cast<int>(o)]; }
  CommCounters& operator+=(const CommCounters& other);
  int64_t bytes_sent() const;
  int64_t bytes_received() const;
  double wait_seconds() const;
};

// Process-level entry points (src/comm/mpi_backend.cpp).
// comm_init starts MPI requesting full thread support (CommWorker's thread
// communicates beside the caller's); call it once, first thing in main. A
// process that never calls it is a world of one: Communicator::world() is
// then the single-process communicator.
void comm_init(int* argc, char*** argv);
void comm_finalize();  // after every Communicator is gone; no-op without comm_init
bool comm_initialized();  // comm_init was called and comm_finalize not yet
// Ends the whole job (every rank) with `code`; without MPI, this process.
// This process exits within kAbortGraceSeconds even when MPI_Abort cannot
// reach an unreachable host. A rank started by mpiexec is also killed
// (SIGKILL, PR_SET_PDEATHSIG) as soon as its launcher (mpiexec or orted) exits.
constexpr int kAbortGraceSeconds = 10;
[[noreturn]] void comm_abort(int code);
int comm_world_rank();  // 0 without MPI
int comm_world_size();  // 1 without MPI
// Drives the transport's progress engine for every posted request of the
// process (Open MPI only moves non-blocking transfers inside MPI calls).
void comm_progress();

// Seconds a rank may wait on one operation before the job is aborted
// (collective_timeout_seconds; default 600). Process-wide.
void set_collective_timeout_seconds(double seconds);
double collective_timeout_seconds();
// What happens on a timeout: by default print the message on stderr and
// comm_abort. Tests install a handler that returns; wait() then cancels the
// request and throws Error(message).
using WatchdogHandler = void (*)(const std::string& message);
void set_watchdog_handler(WatchdogHandler handler);  // nullptr restores the default

class PendingOp;    // src/comm/backend.h
class CommBackend;  // src/comm/backend.h
enum class ElemType;
enum class ReduceOp;

// One posted operation. Move-only; complete it with Communicator::wait.
class Request {
 public:
  Request();
  Request(Request&& other) noexcept;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();  // an active request at destruction is a bug: waits for it
  bool active() const { return op_ != nullptr; }

 private:
  friend class Communicator;
  std::unique_ptr<PendingOp> op_;  // null once complete
  CommOp kind_ = CommOp::barrier;
  int peer_ = -1;
};

class Communicator {
 public:
  // Every rank of the job: a duplicate of the MPI world after comm_init,
  // else this process alone (single()). Collective.
  static Communicator world(const std::string& name = "world");
  // This process alone, rank 0 of 1, whether or not MPI runs: collectives
  // copy this rank's block (reductions leave the data as it is), counters
  // count calls and no bytes, send/recv to any other rank is an error.
  static Communicator single(const std::string& name = "single");
  Communicator(std::unique_ptr<CommBackend> backend, std::string name);
  ~Communicator();
  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  // Collective: the ranks passing the same color form one communicator,
  // ranked by key (ties by rank here).
  Communicator split(int color, int key, const std::string& name) const;
  // Collective: the same ranks in the same order, counted together with
  // this one (counters() of either shows both). Collectives on the two are
  // independent, so another thread may post on it in an order of its own.
  Communicator duplicate(const std::string& name) const;

  // Point to point. Tags must be < 32768 (the least tag bound MPI guarantees).
  Request isend(const void* data, size_t bytes, int dest, int tag) const;
  Request irecv(void* data, size_t bytes, int source, int tag) const;
  void wait(Request& request) const;  // watched; no-op on an inactive request
  // Whether the request has completed (then it becomes inactive); never
  // blocks and, unlike wait(), adds nothing to wait_seconds: for a helper
  // thread whose waiting is hidden behind compute.
  bool test(Request& request) const;
  // Cancels an active request and completes it (error paths only).
  void cancel(Request& request) const;
  // Blocks until done() is true, watched like wait() and counted as time
  // blocked on `op` (with `peer`, or -1): for work another thread completes.
  void wait_until(const std::function<bool()>& done, CommOp op, int peer = -1) const;
  void send(const void* data, size_t bytes, int dest, int tag) const;
  void recv(void* data, size_t bytes, int source, int tag) const;

  // Collectives (blocking, watched). Buffers are rank-major blocks.
  // recv [P][bytes_per_rank]; send is this rank's block (it may be its place in recv).
  void all_gather(const void* send, void* recv, size_t bytes_per_rank) const;
  // send [P][bytes_per_rank]: block j goes to rank j; recv [P][bytes_per_rank]: block i came from rank i.
  void all_to_all(const void* send, void* recv, size_t bytes_per_rank) const;
  // send [P][count] fp32; recv [count] = sum over ranks of their block rank().
  void reduce_scatter_sum(const float* send, float* recv, size_t count_per_rank) const;
  // In place.
  void all_reduce_sum(float* data, size_t count) const;
  void all_reduce_sum(double* data, size_t count) const;
  void all_reduce_sum(int64_t* data, size_t count) const;
  void all_reduce_max(double* data, size_t count) const;
  void all_reduce_max(int64_t* data, size_t count) const;
  void all_reduce_min(double* data, size_t count) const;
  void all_reduce_min(int64_t* data, size_t count) const;
  // Root's `bytes` at `data` into every rank's `data`.
  void broadcast(void* data, size_t bytes, int root) const;
  void barrier() const;
  // Posted forms, counted as above when posted (like isend), to complete with
  // test() or wait(): for a caller that gives up after a deadline of its own
  // (apps/main.cpp after an error) or that must not sleep between polls
  // (timing transfers, src/plan/measure.cpp).
  Request ibarrier() const;
  Request iall_gather(const void* send, void* recv, size_t bytes_per_rank) const;
  Request iall_to_all(const void* send, void* recv, size_t bytes_per_rank) const;

  CommCounters counters() const;
  void reset_counters() const;

 private:
  void all_reduce(void* data, size_t count, ElemType type, size_t elem_bytes, ReduceOp op) const;
  void count(CommOp op, int64_t sent, int64_t received, int64_t hop_bytes = 0) const;
  void finish(Request& request, CommOp op, int peer) const;
  [[noreturn]] void timed_out(double timeout, CommOp op, int peer, Request* request) const;
  // " (host NAME (ADDRESS))" of rank `peer`; for a collective (peer < 0)
  // the other hosts of its ranks; "" where unknown.
  std::string host_text(int peer) const;

  std::unique_ptr<CommBackend> backend_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  // Counters, shared with duplicates; the mutex because waits may run on helper threads.
  struct Tally {
    std::mutex mu;
    CommCounters counters;
  };
  std::shared_ptr<Tally> tally_ = std::make_shared<Tally>();
};

// A persistent helper thread for communication that must progress while the
// calling thread computes (the ring's outgoing K,V stream and its returning
// dK,dV). One job at a time: start(job) hands it a poll function, which the
// thread calls every `poll` interval (driving MPI progress in between with
// comm_progress, for the caller's own requests too) until it returns true.
// Between jobs the thread sleeps on a condition variable and costs nothing, so one worker
// serves every call of its owner instead of a thread per call. The poll
// interval trades latency for CPU: each wake-up runs Open MPI's progress
// engine (~10 us); at S=16384, 2 ranks, 200 us cost 5% of a rank's CPU time
// and 1 ms under 1%, while a 2 MiB chunk still arrives long before the
// ~20 ms piece ahead of it is computed.
// Needs full thread support (comm_init asks for it).
class CommWorker {
 public:
  explicit CommWorker(std::chrono::microseconds poll = std::chrono::microseconds(1000));
  ~CommWorker();
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;

  void start(std::function<bool()> job);
  // Blocks until the job is done (Communicator::wait_until: watched, counted
  // as `op` wait time on `comm`); rethrows what the job threw.
  void finish(const Communicator& comm, CommOp op);
  // Makes a running job return at its next poll and waits for that; for
  // error paths, before the job's state goes away. No-op when idle.
  void abandon();
  bool idle() const { return idle_.load(std::memory_order_acquire); }

 private:
  void loop();
  const std::chrono::microseconds poll_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<bool()> job_;
  bool has_job_ = false, stop_ = false;
  std::atomic<bool> idle_{true}, abandon_{false};
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace longctx

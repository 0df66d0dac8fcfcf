#include "comm/communicator.h"

#include <chrono>
#include <climits>
#include <cstdio>

#include "core/error.h"
#include "core/timer.h"

namespace longctx {

const char* comm_op_name(CommOp op) {
  static const char* names[kNumCommOps] = {"send",           "recv",       "all_gather", "all_to_all",
                                           "reduce_scatter", "all_reduce", "barrier"};
  return names[static_cast<int>(op)];
}

CommCounters& CommCounters::operator+=(const CommCounters& other) {
  for (int i = 0; i < kNumCommOps; ++i) {
    op[i].calls += other.op[i].calls;
    op[i].bytes_sent += other.op[i].bytes_sent;
    op[i].bytes_received += other.op[i].bytes_received;
    op[i].wait_seconds += other.op[i].wait_seconds;
  }
  return *this;
}

int64_t CommCounters::bytes_sent() const {
  int64_t n = 0;
  for (const auto& o : op) n += o.bytes_sent;
  return n;
}
int64_t CommCounters::bytes_received() const {
  int64_t n = 0;
  for (const auto& o : op) n += o.bytes_received;
  return n;
}
double CommCounters::wait_seconds() const {
  double s = 0;
  for (const auto& o : op) s += o.wait_seconds;
  return s;
}

namespace {

std::atomic<double> g_timeout_seconds{600.0};
std::atomic<WatchdogHandler> g_watchdog_handler{nullptr};

void abort_job(const std::string& message) {
  std::fprintf(stderr, "longctx: %s\n", message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
}

int checked_count(size_t bytes) {
  if (bytes > static_cast<size_t>(INT_MAX))
    throw ShapeError("communicator: one message of " + std::to_string(bytes) +
                     " bytes exceeds MPI's 2^31-1 count limit");
  return static_cast<int>(bytes);
}

}  // namespace

void set_collective_timeout_seconds(double seconds) {
  if (!(seconds > 0)) throw ConfigError("collective_timeout_seconds must be > 0");
  g_timeout_seconds = seconds;
}
double collective_timeout_seconds() { return g_timeout_seconds; }
void set_watchdog_handler(WatchdogHandler handler) { g_watchdog_handler = handler; }

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    req_ = other.req_;
    op_ = other.op_;
    peer_ = other.peer_;
    comm_ = other.comm_;
    other.req_ = MPI_REQUEST_NULL;
  }
  return *this;
}

Request::~Request() {
  if (active()) MPI_Wait(&req_, MPI_STATUS_IGNORE);
}

Communicator Communicator::world(const std::string& name) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return Communicator(c, name);
}

Communicator::Communicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  if (comm_ == MPI_COMM_NULL) return;  // a placeholder, assigned later
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Communicator::~Communicator() {
  if (comm_ != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
}

Communicator::Communicator(Communicator&& other) noexcept { *this = std::move(other); }

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    comm_ = other.comm_;
    name_ = std::move(other.name_);
    rank_ = other.rank_;
    size_ = other.size_;
    counters_ = other.counters_;
    other.comm_ = MPI_COMM_NULL;
  }
  return *this;
}

void Communicator::count(CommOp op, int64_t sent, int64_t received) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto& c = counters_[op];
  c.calls += 1;
  c.bytes_sent += sent;
  c.bytes_received += received;
}

CommCounters Communicator::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

void Communicator::reset_counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  counters_ = CommCounters{};
}

void Communicator::timed_out(double timeout, CommOp op, int peer, Request* request) const {
  std::string message = "watchdog: rank " + std::to_string(rank_) + " of communicator '" + name_ +
                        "' waited more than " + std::to_string(timeout) +
                        " s (collective_timeout_seconds) on " + comm_op_name(op) +
                        (peer >= 0 ? " with rank " + std::to_string(peer) : std::string()) +
                        "; aborting the job";
  WatchdogHandler handler = g_watchdog_handler;
  if (!handler) abort_job(message);
  handler(message);
  if (request) cancel(*request);
  throw Error(message);
}

// Polls instead of blocking so that the watchdog can fire; backs off to short
// sleeps so that an oversubscribed rank (8 ranks on 2 cores) does not steal
// the core from the rank it is waiting for.
void Communicator::wait_until(const std::function<bool()>& done, CommOp op, int peer) const {
  Timer timer;
  const double timeout = g_timeout_seconds;
  int polls = 0;
  auto sleep = std::chrono::microseconds(5);
  while (!done()) {
    if (++polls > 50) {
      std::this_thread::sleep_for(sleep);
      if (sleep < std::chrono::microseconds(500)) sleep *= 2;
    }
    if (timer.seconds() > timeout) timed_out(timeout, op, peer, nullptr);
  }
  std::lock_guard<std::mutex> lock(mu_);
  counters_[op].wait_seconds += timer.seconds();
}

void Communicator::wait(Request& request) const {
  if (!request.active()) return;
  Timer timer;
  const double timeout = g_timeout_seconds;
  int done = 0;
  int polls = 0;
  auto sleep = std::chrono::microseconds(5);
  while (true) {
    MPI_Test(&request.req_, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (++polls > 50) {
      std::this_thread::sleep_for(sleep);
      if (sleep < std::chrono::microseconds(500)) sleep *= 2;
    }
    if (timer.seconds() > timeout) timed_out(timeout, request.op_, request.peer_, &request);
  }
  std::lock_guard<std::mutex> lock(mu_);
  counters_[request.op_].wait_seconds += timer.seconds();
}

bool Communicator::test(Request& request) const {
  if (!request.active()) return true;
  int done = 0;
  MPI_Test(&request.req_, &done, MPI_STATUS_IGNORE);
  return done != 0;
}

void Communicator::cancel(Request& request) const {
  if (!request.active()) return;
  MPI_Cancel(&request.req_);
  MPI_Wait(&request.req_, MPI_STATUS_IGNORE);
}

void Communicator::finish(Request& request, CommOp op, int peer) const {
  request.op_ = op;
  request.peer_ = peer;
  request.comm_ = this;
  wait(request);
}

Request Communicator::isend(const void* data, size_t bytes, int dest, int tag) const {
  Request r;
  r.op_ = CommOp::send;
  r.peer_ = dest;
  r.comm_ = this;
  MPI_Isend(data, checked_count(bytes), MPI_BYTE, dest, tag, comm_, &r.req_);
  count(CommOp::send, dest == rank_ ? 0 : static_cast<int64_t>(bytes), 0);
  return r;
}

Request Communicator::irecv(void* data, size_t bytes, int source, int tag) const {
  Request r;
  r.op_ = CommOp::recv;
  r.peer_ = source;
  r.comm_ = this;
  MPI_Irecv(data, checked_count(bytes), MPI_BYTE, source, tag, comm_, &r.req_);
  count(CommOp::recv, 0, source == rank_ ? 0 : static_cast<int64_t>(bytes));
  return r;
}

void Communicator::send(const void* data, size_t bytes, int dest, int tag) const {
  Request r = isend(data, bytes, dest, tag);
  wait(r);
}

void Communicator::recv(void* data, size_t bytes, int source, int tag) const {
  Request r = irecv(data, bytes, source, tag);
  wait(r);
}

void Communicator::all_gather(const void* send, void* recv, size_t bytes_per_rank) const {
  Request r;
  MPI_Iallgather(send, checked_count(bytes_per_rank), MPI_BYTE, recv,
                 checked_count(bytes_per_rank), MPI_BYTE, comm_, &r.req_);
  int64_t n = static_cast<int64_t>(bytes_per_rank) * (size_ - 1);
  count(CommOp::all_gather, n, n);
  finish(r, CommOp::all_gather, -1);
}

void Communicator::all_to_all(const void* send, void* recv, size_t bytes_per_rank) const {
  Request r;
  MPI_Ialltoall(send, checked_count(bytes_per_rank), MPI_BYTE, recv,
                checked_count(bytes_per_rank), MPI_BYTE, comm_, &r.req_);
  int64_t n = static_cast<int64_t>(bytes_per_rank) * (size_ - 1);
  count(CommOp::all_to_all, n, n);
  finish(r, CommOp::all_to_all, -1);
}

void Communicator::reduce_scatter_sum(const float* send, float* recv, size_t count_per_rank) const {
  Request r;
  checked_count(count_per_rank * 4 * size_);
  MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count_per_rank), MPI_FLOAT, MPI_SUM, comm_,
                            &r.req_);
  int64_t n = static_cast<int64_t>(count_per_rank) * 4 * (size_ - 1);
  count(CommOp::reduce_scatter, n, n);
  finish(r, CommOp::reduce_scatter, -1);
}

void Communicator::all_reduce(void* data, size_t n, MPI_Datatype type, size_t elem_bytes,
                              MPI_Op op) const {
  Request r;
  MPI_Iallreduce(MPI_IN_PLACE, data, checked_count(n * elem_bytes) / static_cast<int>(elem_bytes),
                 type, op, comm_, &r.req_);
  int64_t bytes = static_cast<int64_t>(n * elem_bytes) * 2 * (size_ - 1) / size_;
  count(CommOp::all_reduce, bytes, bytes);
  finish(r, CommOp::all_reduce, -1);
}

void Communicator::all_reduce_sum(float* d, size_t n) const { all_reduce(d, n, MPI_FLOAT, 4, MPI_SUM); }
void Communicator::all_reduce_sum(double* d, size_t n) const { all_reduce(d, n, MPI_DOUBLE, 8, MPI_SUM); }
void Communicator::all_reduce_sum(int64_t* d, size_t n) const { all_reduce(d, n, MPI_INT64_T, 8, MPI_SUM); }
void Communicator::all_reduce_max(double* d, size_t n) const { all_reduce(d, n, MPI_DOUBLE, 8, MPI_MAX); }
void Communicator::all_reduce_max(int64_t* d, size_t n) const { all_reduce(d, n, MPI_INT64_T, 8, MPI_MAX); }

void Communicator::barrier() const {
  Request r;
  MPI_Ibarrier(comm_, &r.req_);
  count(CommOp::barrier, 0, 0);
  finish(r, CommOp::barrier, -1);
}

ProgressPump::ProgressPump() {
  thread_ = std::thread([this] {
    while (!stop_.load(std::memory_order_relaxed)) {
      // Any MPI call runs Open MPI's progress engine; nothing is ever sent on
      // MPI_COMM_SELF, so the probe matches nothing.
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
}

ProgressPump::~ProgressPump() {
  stop_ = true;
  thread_.join();
}

CommWorker::CommWorker(std::chrono::microseconds poll) : poll_(poll) {
  thread_ = std::thread([this] { loop(); });
}

CommWorker::~CommWorker() {
  abandon();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CommWorker::loop() {
  while (true) {
    std::function<bool()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return has_job_ || stop_; });
      if (stop_) return;
      job = std::move(job_);
    }
    std::exception_ptr error;
    while (!abandon_.load(std::memory_order_relaxed)) {
      bool done = true;
      try {
        done = job();
      } catch (...) {
        error = std::current_exception();
      }
      if (done) break;
      // Drives Open MPI's progress engine for every request of the process
      // (nothing is ever sent on MPI_COMM_SELF, so the probe matches nothing).
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
      std::this_thread::sleep_for(poll_);
    }
    job = nullptr;  // the job's captures go before the caller may reuse them
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = error;
      has_job_ = false;
    }
    idle_.store(true, std::memory_order_release);
  }
}

void CommWorker::start(std::function<bool()> job) {
  if (!idle()) throw Error("CommWorker: a job is already running");
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    has_job_ = true;
    error_ = nullptr;
    abandon_ = false;
    idle_.store(false, std::memory_order_release);
  }
  cv_.notify_all();
}

void CommWorker::finish(const Communicator& comm, CommOp op) {
  if (!idle()) comm.wait_until([this] { return idle(); }, op);
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

void CommWorker::abandon() {
  if (idle()) return;
  abandon_ = true;
  while (!idle()) std::this_thread::sleep_for(poll_);
  std::lock_guard<std::mutex> lock(mu_);
  error_ = nullptr;
}

}  // namespace longctx

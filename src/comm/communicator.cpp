#include "comm/communicator.h"

#include "core/device.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "comm/backend.h"
#include "core/device.h"

#include "core/error.h"
#include "core/timer.h"

namespace longctx {

const char* comm_op_name(CommOp op) {
  static const char* names[kNumCommOps] = {"send",           "recv",       "all_gather", "all_to_all",
                                           "reduce_scatter", "all_reduce", "barrier",    "broadcast"};
  return names[static_cast<int>(op)];
}

CommCounters& CommCounters::operator+=(const CommCounters& other) {
  for (int i = 0; i < kNumCommOps; ++i) {
    op[i].calls += other.op[i].calls;
    op[i].bytes_sent += other.op[i].bytes_sent;
    op[i].bytes_received += other.op[i].bytes_received;
    op[i].hop_bytes += other.op[i].hop_bytes;
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
  comm_abort(3);
}

}  // namespace

void set_collective_timeout_seconds(double seconds) {
  if (!(seconds > 0)) throw ConfigError("collective_timeout_seconds must be > 0");
  g_timeout_seconds = seconds;
}
double collective_timeout_seconds() { return g_timeout_seconds; }
void set_watchdog_handler(WatchdogHandler handler) { g_watchdog_handler = handler; }

Request::Request() = default;
Request::Request(Request&& other) noexcept { *this = std::move(other); }

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    op_ = std::move(other.op_);  // an overwritten active one still completes, unwatched
    kind_ = other.kind_;
    peer_ = other.peer_;
  }
  return *this;
}

Request::~Request() {
  if (op_) op_->wait();
}

Communicator Communicator::world(const std::string& name) {
  if (!comm_initialized()) return single(name);
  return Communicator(make_mpi_world_backend(), name);
}

Communicator Communicator::single(const std::string& name) { return Communicator(make_single_backend(), name); }

Communicator::Communicator(std::unique_ptr<CommBackend> backend, std::string name)
    : backend_(std::move(backend)), name_(std::move(name)) {
  if (!backend_) throw Error("communicator '" + name_ + "': no backend");
  rank_ = backend_->rank();
  size_ = backend_->size();
}

Communicator::~Communicator() = default;

Communicator::Communicator(Communicator&& other) noexcept { *this = std::move(other); }

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    backend_ = std::move(other.backend_);
    name_ = std::move(other.name_);
    rank_ = other.rank_;
    size_ = other.size_;
    tally_ = std::move(other.tally_);
  }
  return *this;
}

Communicator Communicator::split(int color, int key, const std::string& name) const {
  return Communicator(backend_->split(color, key), name);
}

Communicator Communicator::duplicate(const std::string& name) const {
  Communicator d(backend_->duplicate(), name);
  d.tally_ = tally_;
  return d;
}

void Communicator::count(CommOp op, int64_t sent, int64_t received, int64_t hop_bytes) const {
  std::lock_guard<std::mutex> lock(tally_->mu);
  auto& c = tally_->counters[op];
  const int64_t n = count_repeat();  // a counted loop's one iteration standing for n (core/device.h)
  c.calls += n;
  c.bytes_sent += n * sent;
  c.bytes_received += n * received;
  c.hop_bytes += n * hop_bytes;
}

CommCounters Communicator::counters() const {
  std::lock_guard<std::mutex> lock(tally_->mu);
  return tally_->counters;
}

void Communicator::reset_counters() const {
  std::lock_guard<std::mutex> lock(tally_->mu);
  tally_->counters = CommCounters{};
}

std::string Communicator::host_text(int peer) const {
  if (peer >= 0) {
    const std::string host = backend_->host_of(peer);
    return host.empty() ? "" : " (host " + host + ")";
  }
  // A collective: the hosts of the others it waits for, other than this one's (the first few).
  const std::string here = backend_->host_of(rank_);
  std::vector<std::string> others;
  for (int r = 0; r < size_ && others.size() < 4; ++r) {
    const std::string host = backend_->host_of(r);
    if (!host.empty() && host != here && std::find(others.begin(), others.end(), host) == others.end())
      others.push_back(host);
  }
  std::string text;
  for (const std::string& host : others) text += (text.empty() ? "" : ", ") + host;
  return text.empty() ? "" : " (its ranks on other hosts: " + text + ")";
}

void Communicator::timed_out(double timeout, CommOp op, int peer, Request* request) const {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", timeout);  // "5", as configured, not "5.000000"
  std::string message = "watchdog: rank " + std::to_string(rank_) + " of communicator '" + name_ +
                        "' waited more than " + seconds +
                        " s (collective_timeout_seconds) on " + comm_op_name(op) +
                        (peer >= 0 ? " with rank " + std::to_string(peer) : std::string()) + host_text(peer) +
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
  std::lock_guard<std::mutex> lock(tally_->mu);
  tally_->counters[op].wait_seconds += timer.seconds();
}

void Communicator::wait(Request& request) const {
  if (!request.active()) return;
  Timer timer;
  const double timeout = g_timeout_seconds;
  int polls = 0;
  auto sleep = std::chrono::microseconds(5);
  while (!request.op_->test()) {
    if (++polls > 50) {
      std::this_thread::sleep_for(sleep);
      if (sleep < std::chrono::microseconds(500)) sleep *= 2;
    }
    if (timer.seconds() > timeout) timed_out(timeout, request.kind_, request.peer_, &request);
  }
  request.op_.reset();
  std::lock_guard<std::mutex> lock(tally_->mu);
  tally_->counters[request.kind_].wait_seconds += timer.seconds();
}

bool Communicator::test(Request& request) const {
  if (!request.active()) return true;
  if (!request.op_->test()) return false;
  request.op_.reset();
  return true;
}

void Communicator::cancel(Request& request) const {
  if (!request.active()) return;
  request.op_->cancel();
  request.op_.reset();
}

void Communicator::finish(Request& request, CommOp op, int peer) const {
  request.kind_ = op;
  request.peer_ = peer;
  wait(request);
}

Request Communicator::isend(const void* data, size_t bytes, int dest, int tag) const {
  Request r;
  r.kind_ = CommOp::send;
  r.peer_ = dest;
  r.op_ = backend_->isend(data, bytes, dest, tag);
  const int64_t sent = dest == rank_ ? 0 : static_cast<int64_t>(bytes);
  const int ahead = ((dest - rank_) % size_ + size_) % size_;
  count(CommOp::send, sent, 0, sent * std::min(ahead, size_ - ahead));
  return r;
}

Request Communicator::irecv(void* data, size_t bytes, int source, int tag) const {
  Request r;
  r.kind_ = CommOp::recv;
  r.peer_ = source;
  r.op_ = backend_->irecv(data, bytes, source, tag);
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

Request Communicator::iall_gather(const void* send, void* recv, size_t bytes_per_rank) const {
  Request r;
  r.kind_ = CommOp::all_gather;
  r.op_ = backend_->all_gather(send, recv, bytes_per_rank);
  int64_t n = static_cast<int64_t>(bytes_per_rank) * (size_ - 1);
  count(CommOp::all_gather, n, n);
  return r;
}

Request Communicator::iall_to_all(const void* send, void* recv, size_t bytes_per_rank) const {
  Request r;
  r.kind_ = CommOp::all_to_all;
  r.op_ = backend_->all_to_all(send, recv, bytes_per_rank);
  int64_t n = static_cast<int64_t>(bytes_per_rank) * (size_ - 1);
  count(CommOp::all_to_all, n, n);
  return r;
}

void Communicator::all_gather(const void* send, void* recv, size_t bytes_per_rank) const {
  Request r = iall_gather(send, recv, bytes_per_rank);
  wait(r);
}

void Communicator::all_to_all(const void* send, void* recv, size_t bytes_per_rank) const {
  Request r = iall_to_all(send, recv, bytes_per_rank);
  wait(r);
}

void Communicator::reduce_scatter_sum(const float* send, float* recv, size_t count_per_rank) const {
  Request r;
  r.op_ = backend_->reduce_scatter_sum(send, recv, count_per_rank);
  int64_t n = static_cast<int64_t>(count_per_rank) * 4 * (size_ - 1);
  count(CommOp::reduce_scatter, n, n);
  finish(r, CommOp::reduce_scatter, -1);
}

void Communicator::all_reduce(void* data, size_t n, ElemType type, size_t elem_bytes, ReduceOp op) const {
  Request r;
  r.op_ = backend_->all_reduce(data, n, type, op);
  int64_t bytes = static_cast<int64_t>(n * elem_bytes) * 2 * (size_ - 1) / size_;
  count(CommOp::all_reduce, bytes, bytes);
  finish(r, CommOp::all_reduce, -1);
}

void Communicator::all_reduce_sum(float* d, size_t n) const { all_reduce(d, n, ElemType::f32, 4, ReduceOp::sum); }
void Communicator::all_reduce_sum(double* d, size_t n) const { all_reduce(d, n, ElemType::f64, 8, ReduceOp::sum); }
void Communicator::all_reduce_sum(int64_t* d, size_t n) const { all_reduce(d, n, ElemType::i64, 8, ReduceOp::sum); }
void Communicator::all_reduce_max(double* d, size_t n) const { all_reduce(d, n, ElemType::f64, 8, ReduceOp::max); }
void Communicator::all_reduce_max(int64_t* d, size_t n) const { all_reduce(d, n, ElemType::i64, 8, ReduceOp::max); }
void Communicator::all_reduce_min(double* d, size_t n) const { all_reduce(d, n, ElemType::f64, 8, ReduceOp::min); }
void Communicator::all_reduce_min(int64_t* d, size_t n) const { all_reduce(d, n, ElemType::i64, 8, ReduceOp::min); }

void Communicator::broadcast(void* data, size_t bytes, int root) const {
  if (root < 0 || root >= size_)
    throw Error("communicator '" + name_ + "': broadcast root " + std::to_string(root) + " of " +
                std::to_string(size_) + " ranks");
  Request r;
  r.op_ = backend_->broadcast(data, bytes, root);
  const int64_t n = static_cast<int64_t>(bytes);
  if (rank_ == root) count(CommOp::broadcast, n * (size_ - 1), 0);
  else count(CommOp::broadcast, 0, n);
  finish(r, CommOp::broadcast, root);
}

void Communicator::barrier() const {
  Request r = ibarrier();
  wait(r);
}

Request Communicator::ibarrier() const {
  Request r;
  r.kind_ = CommOp::barrier;
  r.op_ = backend_->barrier();
  count(CommOp::barrier, 0, 0);
  return r;
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
      comm_progress();  // for every request of the process, the caller's too
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

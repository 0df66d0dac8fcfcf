// The MPI transport of src/comm/communicator.h: the only file of the project
// that includes <mpi.h>. Every operation is posted non-blocking; the
// Communicator completes it through MpiOp::test (its watched wait).
#include <mpi.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "comm/backend.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace longctx {

namespace {

// Every world rank's host, as host_of names it: "name (address)", the first
// IPv4 address that is not loopback (hosts that share a name, as the
// network namespaces of scripts/cluster.sh do, differ in it).
std::vector<std::string>& world_hosts() {
  static std::vector<std::string> hosts;
  return hosts;
}

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
  std::string host_of(int rank) const override {
    MPI_Group mine, world;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    int world_rank = MPI_UNDEFINED;
    MPI_Group_translate_ranks(mine, 1, &rank, world, &world_rank);
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    return world_rank >= 0 && world_rank < static_cast<int>(world_hosts().size()) ? world_hosts()[world_rank] : "";
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

namespace {

std::string this_host() {
  char name[64] = {};
  gethostname(name, sizeof name - 1);
  std::string out = name;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a; a = a->ifa_next)
      if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && !(a->ifa_flags & IFF_LOOPBACK)) {
        char ip[INET_ADDRSTRLEN] = {};
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, ip, sizeof ip);
        out += std::string(" (") + ip + ")";
        break;
      }
    freeifaddrs(list);
  }
  return out;
}

void gather_world_hosts() {
  constexpr int kBytes = 96;
  char mine[kBytes] = {};
  std::snprintf(mine, sizeof mine, "%s", this_host().c_str());
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<char> all(static_cast<size_t>(size) * kBytes);
  MPI_Allgather(mine, kBytes, MPI_CHAR, all.data(), kBytes, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < size; ++r) world_hosts().emplace_back(all.data() + r * kBytes);
}

// No rank outlives its job. A rank that mpiexec (or an orted) started dies
// with its launcher: once the launcher is gone (it exited, was killed, or
// gave up on an unreachable host), nobody will end or collect this rank,
// and a scheduler may already be starting the next job on these nodes.
// PR_SET_PDEATHSIG(SIGKILL) rather than watching getppid: the kernel queues
// the SIGKILL while the launcher exits, before whoever waits for the
// launcher hears of it, so no rank runs a step or renames a checkpoint into
// place after its mpiexec has exited (D6; a SIGTERM handler would let the
// graceful stop go on, and the launcher that would read a message is gone).
// The signal comes when the thread that forked the rank exits: Open MPI's
// launchers fork from their event loop's threads, which live until the
// launcher ends. Set before MPI_Init; the parent checked again after prctl:
// a launcher that died just before it would never send the signal.
void end_with_the_launcher() {
  if (!std::getenv("OMPI_COMM_WORLD_RANK")) return;  // not started by mpiexec: a singleton keeps its shell's rules
  const pid_t launcher = ::getppid();
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != launcher || launcher == 1) {
    static const char msg[] = "longctx: this rank's launcher (mpiexec or orted) is gone: exiting (143)\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    std::_Exit(143);
  }
}

}  // namespace

void comm_init(int* argc, char*** argv) {
  int provided = 0;
  end_with_the_launcher();
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  gather_world_hosts();
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

namespace {

// The start time of process `pid` (field 22 of /proc/PID/stat, in clock
// ticks), or 0: with the pid, it names one process, never a later one that
// reused the pid. Only open/read: callable after fork.
unsigned long long start_time_of(pid_t pid) {
  char path[32], buf[1024];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY);
  if (fd < 0) return 0;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  for (int field = 2; p && *p && field < 22; ++p)
    if (*p == ' ') ++field;
  unsigned long long t = 0;
  for (; p && *p >= '0' && *p <= '9'; ++p) t = t * 10 + static_cast<unsigned long long>(*p - '0');
  return t;
}

// A process of its own (it outlives this rank, whom the launcher may kill
// first) that waits out the grace period and then kills this rank's
// launcher if that same process is still there: mpiexec or an orted stuck
// sending to an unreachable host. Its own ranks then end with it
// (end_with_the_launcher), mpiexec exits non-zero (killed), and an orted
// that lost its mpiexec no longer lingers on its host.
void reap_the_launcher_later() {
  if (!std::getenv("OMPI_COMM_WORLD_RANK")) return;
  const pid_t launcher = ::getppid();
  const unsigned long long started = start_time_of(launcher);
  if (started == 0 || ::fork() != 0) return;  // the rank goes on to MPI_Abort
  ::setsid();  // out of the rank's process group and session: a kill of those spares it
  // No descriptor of the rank's: its stdout/stderr pipes and sockets held
  // open here would keep the launcher waiting for them to close.
  if (::syscall(SYS_close_range, 0u, ~0u, 0u) != 0)
    for (int fd = 0; fd < 4096; ++fd) ::close(fd);
  struct timespec left = {kAbortGraceSeconds + 5, 0};
  while (::nanosleep(&left, &left) != 0) {
  }
  if (start_time_of(launcher) == started) ::kill(launcher, SIGKILL);
  ::_exit(0);
}

}  // namespace

void comm_abort(int code) {
  // MPI_Abort asks the launcher to end every rank; when a host or the link
  // to it is gone, it can wait for that host forever. This rank leaves
  // after a grace period whatever MPI_Abort does, and its launcher is
  // killed a little later if it is still stuck (reap_the_launcher_later).
  if (comm_initialized()) reap_the_launcher_later();
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::seconds(kAbortGraceSeconds));
    static const char msg[] = "longctx: MPI_Abort did not end the job within its grace period: exiting alone\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    std::_Exit(code);
  }).detach();
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

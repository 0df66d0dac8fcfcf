// ranks: 1 2 4
// Communicator: results of every operation against values computed here,
// byte counters against the formulas in src/comm/communicator.h, the mesh's
// rank order and sub-communicators, and the watchdog.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "comm/mesh.h"
#include "core/error.h"

namespace longctx {
namespace {

TEST(Communicator, CollectivesAndCounters) {
  Communicator c = Communicator::world("test");
  const int P = c.size(), r = c.rank();
  const size_t n = 5;
  std::vector<int32_t> mine(n, r), all(n * P);
  c.all_gather(mine.data(), all.data(), n * 4);
  for (int i = 0; i < P; ++i) EXPECT_EQ(all[i * n], i);

  std::vector<int32_t> to(P), from(P);
  for (int j = 0; j < P; ++j) to[j] = 100 * r + j;
  c.all_to_all(to.data(), from.data(), 4);
  for (int i = 0; i < P; ++i) EXPECT_EQ(from[i], 100 * i + r);

  std::vector<float> blocks(3 * P), out(3);
  for (int j = 0; j < P; ++j)
    for (int x = 0; x < 3; ++x) blocks[j * 3 + x] = static_cast<float>(r + j + x);
  c.reduce_scatter_sum(blocks.data(), out.data(), 3);
  const float rank_sum = static_cast<float>(P * (P - 1) / 2);
  for (int x = 0; x < 3; ++x) EXPECT_FLOAT_EQ(out[x], rank_sum + P * (r + x));

  std::vector<double> d(8, 1.0);
  c.all_reduce_sum(d.data(), d.size());
  EXPECT_DOUBLE_EQ(d[7], P);
  c.barrier();

  CommCounters k = c.counters();
  EXPECT_EQ(k[CommOp::all_gather].bytes_sent, static_cast<int64_t>(n * 4) * (P - 1));
  EXPECT_EQ(k[CommOp::all_to_all].bytes_received, 4 * (P - 1));
  EXPECT_EQ(k[CommOp::reduce_scatter].bytes_sent, 12 * (P - 1));
  EXPECT_EQ(k[CommOp::all_reduce].bytes_sent, 64 * 2 * (P - 1) / P);
  EXPECT_EQ(k[CommOp::barrier].calls, 1);
  c.reset_counters();
  EXPECT_EQ(c.counters().bytes_sent(), 0);
}

// The operations the apps need beyond the training path: broadcast from each
// root, min reductions, int64 max, split with a reversed key, ibarrier.
TEST(Communicator, BroadcastMinSplitAndIbarrier) {
  Communicator c = Communicator::world("more-ops");
  const int P = c.size(), r = c.rank();
  for (int root = 0; root < P; ++root) {
    std::vector<int64_t> v(3, r == root ? 1000 + root : -1);
    c.reset_counters();
    c.broadcast(v.data(), v.size() * sizeof(int64_t), root);
    for (int64_t x : v) EXPECT_EQ(x, 1000 + root);
    const CommOpCounters k = c.counters()[CommOp::broadcast];
    EXPECT_EQ(k.calls, 1);
    EXPECT_EQ(k.bytes_sent, r == root ? 24 * (P - 1) : 0);
    EXPECT_EQ(k.bytes_received, r == root ? 0 : 24);
  }

  c.reset_counters();
  double d[2] = {static_cast<double>(r) + 0.5, -static_cast<double>(r)};
  c.all_reduce_min(d, 2);
  EXPECT_EQ(d[0], 0.5);
  EXPECT_EQ(d[1], -static_cast<double>(P - 1));
  int64_t i[2] = {10 + r, -3 * r};
  c.all_reduce_min(i, 2);
  EXPECT_EQ(i[0], 10);
  EXPECT_EQ(i[1], -3 * (P - 1));
  int64_t j[1] = {7 * r};
  c.all_reduce_max(j, 1);
  EXPECT_EQ(j[0], 7 * (P - 1));
  EXPECT_EQ(c.counters()[CommOp::all_reduce].calls, 3);
  EXPECT_EQ(c.counters()[CommOp::all_reduce].bytes_sent, 2 * (16 * 2 * (P - 1) / P) + 8 * 2 * (P - 1) / P);

  // Even and odd ranks, each group ordered by decreasing world rank.
  Communicator half = c.split(r % 2, -r, "half");
  std::vector<int> expected;
  for (int q = P - 1; q >= 0; --q)
    if (q % 2 == r % 2) expected.push_back(q);
  ASSERT_EQ(half.size(), static_cast<int>(expected.size()));
  EXPECT_EQ(half.name(), "half");
  EXPECT_EQ(expected[half.rank()], r);
  std::vector<int> members(half.size());
  half.all_gather(&r, members.data(), sizeof(int));
  EXPECT_EQ(members, expected);

  Request b = c.ibarrier();
  c.wait(b);
  EXPECT_FALSE(b.active());
  EXPECT_EQ(c.counters()[CommOp::barrier].calls, 1);

  // The posted all-gather and all-to-all, completed by polling test().
  c.reset_counters();
  std::vector<int64_t> gathered(P, -1), to(P), from(P, -1);
  const int64_t mine = 5 * r + 1;
  for (int q = 0; q < P; ++q) to[q] = 100 * r + q;
  Request g = c.iall_gather(&mine, gathered.data(), sizeof mine);
  Request a = c.iall_to_all(to.data(), from.data(), sizeof(int64_t));
  while (!c.test(g) || !c.test(a)) {
  }
  for (int q = 0; q < P; ++q) {
    EXPECT_EQ(gathered[q], 5 * q + 1);
    EXPECT_EQ(from[q], 100 * q + r);
  }
  EXPECT_EQ(c.counters()[CommOp::all_gather].bytes_sent, 8 * (P - 1));
  EXPECT_EQ(c.counters()[CommOp::all_to_all].bytes_received, 8 * (P - 1));
  EXPECT_EQ(c.counters()[CommOp::all_gather].wait_seconds, 0.0);  // test() never counts as blocked
}

TEST(Communicator, PointToPointRing) {
  Communicator c = Communicator::world("p2p");
  const int P = c.size(), r = c.rank();
  std::vector<float> send(1000, static_cast<float>(r)), recv(1000, -1.f);
  Request rr = c.irecv(recv.data(), 4000, (r - 1 + P) % P, 7);
  Request sr = c.isend(send.data(), 4000, (r + 1) % P, 7);
  c.wait(rr);
  c.wait(sr);
  EXPECT_EQ(recv[999], static_cast<float>((r - 1 + P) % P));
  const int64_t expected = P > 1 ? 4000 : 0;  // messages to oneself are not counted
  EXPECT_EQ(c.counters()[CommOp::send].bytes_sent, expected);
  EXPECT_EQ(c.counters()[CommOp::recv].bytes_received, expected);
}

// The ring's helper thread: a job streams messages out while this thread
// waits on its own receives; only the caller's waits count as blocked time,
// and one worker serves several jobs in turn.
TEST(CommWorker, JobsRunOnThePersistentThread) {
  Communicator c = Communicator::world("worker");
  const int P = c.size(), r = c.rank();
  CommWorker worker;
  for (int round = 0; round < 3; ++round) {
    c.reset_counters();
    std::vector<float> send(4096, static_cast<float>(r + round)), recv(4096, -1.f);
    Request sr;
    int step = 0;  // 0: post, 1: wait for the send
    worker.start([&] {
      if (step == 0) {
        sr = c.isend(send.data(), send.size() * 4, (r + 1) % P, 40 + round);
        step = 1;
        return false;
      }
      return c.test(sr);
    });
    Request rr = c.irecv(recv.data(), recv.size() * 4, (r - 1 + P) % P, 40 + round);
    c.wait(rr);
    worker.finish(c, CommOp::send);
    EXPECT_TRUE(worker.idle());
    EXPECT_EQ(recv[4095], static_cast<float>((r - 1 + P) % P + round));
    const CommCounters k = c.counters();
    EXPECT_EQ(k[CommOp::send].calls, 1);
    EXPECT_EQ(k[CommOp::send].bytes_sent, P > 1 ? 4096 * 4 : 0);
  }
}

TEST(CommWorker, RethrowsWhatTheJobThrew) {
  Communicator c = Communicator::world("worker-error");
  CommWorker worker;
  worker.start([]() -> bool { throw Error("job failed"); });
  EXPECT_THROW(worker.finish(c, CommOp::send), Error);
  worker.start([] { return true; });  // usable again
  worker.finish(c, CommOp::send);
  EXPECT_TRUE(worker.idle());
}

TEST(Mesh, RankOrderAndGroups) {
  int world = 1;
  world = comm_world_size();
  // Every factorization of the world into dp x (ulysses x ring) x tp.
  for (int tp = 1; tp <= world; ++tp)
    for (int cp = 1; cp * tp <= world; ++cp)
      for (int u = 1; u <= cp; ++u) {
        if (world % (cp * tp) != 0 || cp % u != 0) continue;
        const int dp = world / (cp * tp), R = cp / u;
        Mesh m(dp, cp, u, tp);
        const int w = m.world_rank();
        EXPECT_EQ(w, ((m.dp_rank() * R + m.ring_rank()) * u + m.ulysses_rank()) * tp + m.tp_rank());
        EXPECT_EQ(m.cp_rank(), m.ring_rank() * u + m.ulysses_rank());
        EXPECT_EQ(m.dp().size(), dp);
        EXPECT_EQ(m.cp().size(), cp);
        EXPECT_EQ(m.ulysses().size(), u);
        EXPECT_EQ(m.ring().size(), R);
        EXPECT_EQ(m.tp().size(), tp);
        EXPECT_EQ(m.replicas().size(), dp * cp);
        EXPECT_EQ(m.cp().rank(), m.cp_rank());
        EXPECT_EQ(m.ring().rank(), m.ring_rank());
        // Each group really holds the ranks that differ only on its axis:
        // the world ranks gathered over cp share dp and tp coordinates.
        std::vector<int> ranks(cp);
        m.cp().all_gather(&w, ranks.data(), sizeof(int));
        for (int i = 0; i < cp; ++i)
          EXPECT_EQ(ranks[i], ((m.dp_rank() * R + i / u) * u + i % u) * tp + m.tp_rank());
      }
}

TEST(Mesh, ProductMustEqualWorld) {
  int world = 1;
  world = comm_world_size();
  try {
    Mesh m(1, world + 1, 1, 1);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("but the job has " + std::to_string(world) + " ranks"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(validate_mesh(MeshShape{1, 4, 3, 1}, 4), ConfigError);  // ulysses must divide cp
}

std::string g_watchdog_message;
void record_watchdog(const std::string& message) { g_watchdog_message = message; }

TEST(Communicator, WatchdogNamesTheOperation) {
  Communicator c = Communicator::world("watched");
  set_watchdog_handler(record_watchdog);
  set_collective_timeout_seconds(0.2);
  int never = 0;
  Request r = c.irecv(&never, sizeof never, c.rank(), 99);  // nobody sends tag 99
  EXPECT_THROW(c.wait(r), Error);
  EXPECT_NE(g_watchdog_message.find("waited more than"), std::string::npos) << g_watchdog_message;
  EXPECT_NE(g_watchdog_message.find("recv"), std::string::npos) << g_watchdog_message;
  EXPECT_NE(g_watchdog_message.find("'watched'"), std::string::npos) << g_watchdog_message;
  set_collective_timeout_seconds(600);
  set_watchdog_handler(nullptr);
}

}  // namespace
}  // namespace longctx

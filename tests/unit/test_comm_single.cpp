// The single-process communicator (src/comm/single_backend.cpp), without
// mpiexec and without MPI ever started: collectives of one rank copy this
// rank's block, reductions leave the data as it is, counters count calls and
// no bytes; a Mesh of one rank, and a Trainer step through it.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "comm/mesh.h"
#include "core/error.h"
#include "temp_dir.h"
#include "train/trainer.h"

namespace longctx {
namespace {

TEST(SingleCommunicator, WorldWithoutMpiIsThisProcess) {
  EXPECT_FALSE(comm_initialized());
  EXPECT_EQ(comm_world_rank(), 0);
  EXPECT_EQ(comm_world_size(), 1);
  Communicator world = Communicator::world("w");
  EXPECT_EQ(world.rank(), 0);
  EXPECT_EQ(world.size(), 1);
  Communicator sub = world.split(7, 3, "sub");
  EXPECT_EQ(sub.size(), 1);
  EXPECT_EQ(sub.name(), "sub");
}

TEST(SingleCommunicator, CollectivesOfOneRankAndCounters) {
  Communicator c = Communicator::single("one");
  const std::vector<int32_t> mine = {1, 2, 3};
  std::vector<int32_t> all(3, -1);
  c.all_gather(mine.data(), all.data(), 12);
  EXPECT_EQ(all, mine);
  std::vector<int32_t> a2a(3, -1);
  c.all_to_all(mine.data(), a2a.data(), 12);
  EXPECT_EQ(a2a, mine);
  const std::vector<float> blocks = {0.5f, -1.0f};
  std::vector<float> out(2, 0.0f);
  c.reduce_scatter_sum(blocks.data(), out.data(), 2);
  EXPECT_EQ(out, blocks);
  std::vector<float> f = {1.5f, -2.0f};
  c.all_reduce_sum(f.data(), 2);
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f}));
  double d[2] = {3.0, -4.0};
  c.all_reduce_sum(d, 2);
  c.all_reduce_max(d, 2);
  c.all_reduce_min(d, 2);
  EXPECT_EQ(d[0], 3.0);
  EXPECT_EQ(d[1], -4.0);
  int64_t i[1] = {42};
  c.all_reduce_sum(i, 1);
  c.all_reduce_max(i, 1);
  c.all_reduce_min(i, 1);
  EXPECT_EQ(i[0], 42);
  double b = 9.0;
  c.broadcast(&b, sizeof b, 0);
  EXPECT_EQ(b, 9.0);
  c.barrier();
  Request r = c.ibarrier();
  EXPECT_TRUE(c.test(r));

  const CommCounters k = c.counters();
  EXPECT_EQ(k.bytes_sent(), 0);
  EXPECT_EQ(k.bytes_received(), 0);
  EXPECT_EQ(k[CommOp::all_gather].calls, 1);
  EXPECT_EQ(k[CommOp::all_to_all].calls, 1);
  EXPECT_EQ(k[CommOp::reduce_scatter].calls, 1);
  EXPECT_EQ(k[CommOp::all_reduce].calls, 7);
  EXPECT_EQ(k[CommOp::broadcast].calls, 1);
  EXPECT_EQ(k[CommOp::barrier].calls, 2);
  c.reset_counters();
  EXPECT_EQ(c.counters()[CommOp::all_reduce].calls, 0);
}

TEST(SingleCommunicator, MessagesToOneselfAndNoOtherPeer) {
  Communicator c = Communicator::single("p2p");
  std::vector<float> send(100, 2.5f), recv(100, 0.0f);
  Request rr = c.irecv(recv.data(), 400, 0, 5);
  EXPECT_FALSE(c.test(rr));  // nothing sent with tag 5 yet
  c.send(send.data(), 400, 0, 5);
  c.wait(rr);
  EXPECT_EQ(recv[99], 2.5f);
  EXPECT_EQ(c.counters().bytes_sent(), 0);  // messages to oneself are not counted
  EXPECT_EQ(c.counters()[CommOp::send].calls, 1);
  EXPECT_THROW(c.isend(send.data(), 4, 1, 0), Error);
  EXPECT_THROW(c.irecv(recv.data(), 4, 1, 0), Error);
  EXPECT_THROW(c.broadcast(send.data(), 4, 1), Error);
}

std::string g_watchdog_message;
void record_watchdog(const std::string& message) { g_watchdog_message = message; }

TEST(SingleCommunicator, WatchdogNamesTheOperation) {
  Communicator c = Communicator::single("watched");
  set_watchdog_handler(record_watchdog);
  set_collective_timeout_seconds(0.2);
  int never = 0;
  Request r = c.irecv(&never, sizeof never, 0, 99);  // nobody sends tag 99
  EXPECT_THROW(c.wait(r), Error);
  EXPECT_FALSE(r.active());  // cancelled
  EXPECT_NE(g_watchdog_message.find("recv"), std::string::npos) << g_watchdog_message;
  EXPECT_NE(g_watchdog_message.find("'watched'"), std::string::npos) << g_watchdog_message;
  set_collective_timeout_seconds(600);
  set_watchdog_handler(nullptr);
}

TEST(SingleMesh, OneRankEverywhere) {
  for (const Mesh& m : {Mesh::single(), Mesh(1, 1, 1, 1)}) {
    EXPECT_EQ(m.world_rank(), 0);
    EXPECT_EQ(m.dp_rank() + m.cp_rank() + m.ulysses_rank() + m.ring_rank() + m.tp_rank(), 0);
    for (const Communicator* c : {&m.world(), &m.dp(), &m.cp(), &m.ulysses(), &m.ring(), &m.tp(), &m.replicas()})
      EXPECT_EQ(c->size(), 1);
  }
  EXPECT_THROW(Mesh(1, 2, 1, 1), ConfigError);  // the world has one rank
}

TEST(SingleMesh, TrainerStepsThroughIt) {
  TempDir t;
  std::map<std::string, ConfigValue> v = {
      {"base_emb_dim", int64_t(32)},     {"base_num_query_heads", int64_t(2)},
      {"base_num_kv_heads", int64_t(1)}, {"head_dim", int64_t(16)},
      {"base_mlp_dim", int64_t(64)},     {"base_num_decoder_layers", int64_t(2)},
      {"dataset_type", std::string("synthetic")},
      {"max_target_length", int64_t(32)}, {"per_device_batch_size", int64_t(2)},
      {"steps", int64_t(2)},             {"peak_tflops_per_device", 1.0},
      {"base_output_directory", t.path.string()}, {"num_threads", int64_t(1)},
      {"shard_optimizer_over_data", true}};
  RunConfig c = config_from_values(v);
  validate_config(c, 1);
  const Mesh mesh = Mesh::single();
  Trainer a(c, mesh);
  EXPECT_FALSE(a.optimizer().sharded());  // one replica: nothing to shard
  mesh.reset_counters();
  const StepMetrics m = a.train_step();
  EXPECT_GT(m.loss, 0.0);
  EXPECT_GT(m.grad_norm, 0.0);
  const CommCounters k = mesh.total_counters();
  EXPECT_GT(k[CommOp::all_reduce].calls, 0);  // the step's world reductions ran, as on many ranks
  EXPECT_EQ(k.bytes_sent(), 0);
  EXPECT_EQ(k.bytes_received(), 0);
  // The same step through the world communicator (no MPI: this process) is the same step.
  const Mesh world_mesh(1, 1, 1, 1);
  Trainer b(c, world_mesh);
  const StepMetrics n = b.train_step();
  EXPECT_EQ(n.loss, m.loss);
  EXPECT_EQ(n.grad_norm, m.grad_norm);
}

}  // namespace
}  // namespace longctx

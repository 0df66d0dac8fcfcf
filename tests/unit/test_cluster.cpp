// Two hosts on this machine (scripts/cluster.sh: network namespaces on a
// bridge, Open MPI over TCP between them): every strategy across the hosts
// trains as one rank does, ranks fill a host before the next (the mesh's
// inner axes share a host), and a link cut, a host killed or a host frozen
// ends every process of the job within collective_timeout_seconds + 60 s,
// after which the run resumes to the loss of an uninterrupted one. Needs
// root (network namespaces): SKIPs loudly without.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "run_command.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kTimeout = 5;  // collective_timeout_seconds of the fault runs
const std::string kScript = LONGCTX_SOURCE_DIR "/scripts/cluster.sh";

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Loss by step of a metrics file (JSON lines).
std::map<int64_t, double> losses(const fs::path& metrics) {
  std::map<int64_t, double> out;
  std::istringstream in(read(metrics));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) {
      const auto j = nlohmann::json::parse(line);
      out[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
  return out;
}

// Hosts up in the constructor, down in the destructor (pass or fail).
struct Cluster {
  std::string name = "lct" + std::to_string(::getpid() % 100000);
  fs::path dir;
  CommandResult up;
  Cluster(const fs::path& where, int hosts, int slots, const std::string& rate = "") : dir(where / "cluster") {
    up = run_command(shell_quote(kScript) + " up " + std::to_string(hosts) + " --slots " + std::to_string(slots) +
                     (rate.empty() ? "" : " --rate " + rate) + " --dir " + shell_quote(dir.string()) + " --name " + name);
  }
  ~Cluster() { run_command(shell_quote(kScript) + " down --name " + name); }
  bool ok() const { return up.status == 0; }
  CommandResult on(const std::string& what) { return run_command(shell_quote(kScript) + " " + what + " --name " + name); }
  // `down`, then what it left: processes that were on the hosts and still
  // run, namespaces and interfaces of this cluster's name; "" when nothing.
  std::string down_leftovers() {
    std::string pids;
    for (int h = 1; h <= 2; ++h) pids += run_command("ip netns pids " + name + "-h" + std::to_string(h) + " 2>/dev/null").output;
    const CommandResult d = on("down");
    std::string left = d.status == 0 ? "" : "down failed: " + d.output;
    std::istringstream in(pids);
    for (std::string pid; in >> pid;) {
      const std::string stat = read("/proc/" + pid + "/stat");
      const size_t paren = stat.rfind(')');
      if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z') left += "process " + stat.substr(0, paren + 1) + " ";
    }
    left += run_command("ip netns list | grep '^" + name + "-'; ip -o link show | grep -o '" + name + "-[a-z0-9-]*'").output;
    return left;
  }
  // Live processes (not zombies) on host h.
  std::string live(int h) {
    std::string out;
    std::istringstream in(on("procs " + std::to_string(h)).output);
    for (std::string pid, stat, comm; in >> pid >> stat >> comm;)
      if (stat[0] != 'Z') out += comm + "(" + stat + ") ";
    return out;
  }
  std::string mpiexec(const std::string& args) const {
    return shell_quote((dir / "mpiexec").string()) + " -x OMP_NUM_THREADS=1 " + args;
  }
};

std::string train(const fs::path& out, const std::string& extra) {
  return shell_quote(LONGCTX_BINARY) + " train " + shell_quote(LONGCTX_SOURCE_DIR "/configs/base.yml") +
         " model_name=tiny dataset_type=synthetic max_target_length=256 steps=4 log_period=1 "
         "base_output_directory=" + shell_quote(out.string()) +
         " metrics_file=" + shell_quote((out / "metrics.jsonl").string()) + " " + extra;
}

#define CLUSTER_OR_SKIP(c) \
  if (!(c).ok()) GTEST_SKIP() << "scripts/cluster.sh could not make hosts here (root needed): " << (c).up.output

}  // namespace

TEST(Cluster, EveryStrategyAcrossTwoHostsTrainsAsOneRank) {
  TempDir t;
  Cluster c(t.path, 2, 2);
  CLUSTER_OR_SKIP(c);
  const CommandResult one = run_command("OMP_NUM_THREADS=1 " + train(t.path / "one", "enable_checkpointing=false"));
  ASSERT_EQ(one.status, 0) << one.output;
  const auto want = losses(t.path / "one" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 4u);
  struct Case {
    std::string strategy;
    int ranks;
    std::string extra;
  };
  // 2 ranks: one per host (--map-by node); usp: ulysses 2 inside each host, ring 2 across.
  for (const Case& k : {Case{"ring", 2, "--map-by node"}, Case{"all_gather", 2, "--map-by node"},
                        Case{"ulysses", 2, "--map-by node"}, Case{"usp", 4, ""}}) {
    SCOPED_TRACE(k.strategy);
    const fs::path out = t.path / k.strategy;
    const std::string cp = " ici_context_parallelism=" + std::to_string(k.ranks) +
                           " context_parallel_strategy=" + k.strategy +
                           (k.strategy == "usp" ? " ici_context_usp_ulysses_parallelism=2" : "");
    const CommandResult r = run_command("timeout 120 " + c.mpiexec(k.extra + " -n " + std::to_string(k.ranks) + " " +
                                                                   train(out, "enable_checkpointing=false" + cp)));
    ASSERT_EQ(r.status, 0) << r.output;
    const auto got = losses(out / "metrics.jsonl");
    ASSERT_EQ(got.size(), want.size()) << r.output;
    for (const auto& [step, loss] : want)
      EXPECT_LT(std::fabs(got.at(step) - loss), 1e-5 * loss) << "step " << step << ": " << got.at(step) << " vs one rank's " << loss;
  }
}

TEST(Cluster, RanksFillAHostBeforeTheNextSoTheInnerAxesShareOne) {
  TempDir t;
  Cluster c(t.path, 2, 2);
  CLUSTER_OR_SKIP(c);
  // The mesh's order (src/comm/mesh.h): tp fastest, then ulysses, so
  // consecutive ranks form the inner groups; with S slots per host they stay
  // on one host.
  const CommandResult r = run_command("timeout 60 " + c.mpiexec("-n 4 sh -c " + shell_quote(
      "echo rank $OMPI_COMM_WORLD_RANK host $(ip -o -4 addr show eth0 | awk '{print $4}')")));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* line : {"rank 0 host 10.77.0.1/", "rank 1 host 10.77.0.1/", "rank 2 host 10.77.0.2/", "rank 3 host 10.77.0.2/"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
}

// `plan --measure` across 2 hosts joined by a 200 Mbit/s token bucket (25 MB/s
// each way) learns the link: the hosts (1 rank each), a latency, and every
// rate between them at or under the bucket's (shared memory or loopback
// would be 100x over it) and not far below (2 vCPUs, TCP: at least 1/5;
// Open MPI's all-reduce ran at half the exchange rate here).
TEST(Cluster, PlanMeasureLearnsTheRateLimitedLink) {
  TempDir t;
  Cluster c(t.path, 2, 1, "200mbit");
  CLUSTER_OR_SKIP(c);
  const fs::path profile = t.path / "profile.yml";
  const CommandResult r = run_command("timeout 300 " + c.mpiexec("-n 2 " + shell_quote(LONGCTX_BINARY) +
                                                                 " plan --measure --quick --output " +
                                                                 shell_quote(profile.string())));
  ASSERT_EQ(r.status, 0) << r.output;
  std::map<std::string, double> got;
  std::istringstream in(read(profile));
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(": ");
    if (colon != std::string::npos && line[0] != ' ' && line[0] != '#') got[line.substr(0, colon)] = std::atof(line.c_str() + colon + 2);
  }
  constexpr double kRate = 200e6 / 8;
  EXPECT_EQ(got["devices_per_node"], 1) << r.output;
  EXPECT_GT(got["inter_node_latency"], 0);
  EXPECT_LT(got["inter_node_latency"], 0.01);
  for (const char* key : {"inter_node_bandwidth", "inter_node_all_reduce_bandwidth", "inter_node_collective_bandwidth",
                          "inter_node_all_to_all_bandwidth"}) {
    EXPECT_LE(got[key], 1.1 * kRate) << key << "\n" << r.output;
    EXPECT_GE(got[key], 0.2 * kRate) << key << "\n" << r.output;
  }
}

// A fault mid-run on host 2 of 2 (one rank each, ring cp=2): every process
// on both hosts ends, mpiexec non-zero, within collective_timeout_seconds +
// 60 s; the checkpoints left resume to the uninterrupted run's losses, bit
// for bit (same mesh, 1 thread), on the same two hosts and on one.
class ClusterFault : public testing::TestWithParam<std::string> {};

TEST_P(ClusterFault, EndsEveryProcessThenResumes) {
  const std::string fault = GetParam();
  TempDir t;
  Cluster c(t.path, 2, 1);
  CLUSTER_OR_SKIP(c);
  // Only the faulted run waits kTimeout: the others may be slowed by a busy machine.
  const std::string run = " max_target_length=2048 steps=40 checkpoint_period=2 ici_context_parallelism=2 "
                          "context_parallel_strategy=ring collective_timeout_seconds=";
  const std::string patient = run + "60", faulted = run + std::to_string(kTimeout);
  const CommandResult straight = run_command("timeout 300 " + c.mpiexec("-n 2 " + train(t.path / "straight", patient)));
  ASSERT_EQ(straight.status, 0) << straight.output;
  const auto want = losses(t.path / "straight" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 40u);

  const fs::path out = t.path / "faulted", log = t.path / "faulted.log", rc = t.path / "faulted.rc";
  run_command("( timeout 600 " + c.mpiexec("-n 2 " + train(out, faulted)) + " > " + shell_quote(log.string()) +
              " 2>&1; echo $? > " + shell_quote(rc.string()) + " ) > /dev/null 2>&1 &");
  auto steps_done = [&] { return fs::exists(out / "metrics.jsonl") ? losses(out / "metrics.jsonl").size() : 0u; };
  for (auto start = Clock::now(); steps_done() < 5 && Clock::now() - start < std::chrono::seconds(120);)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(steps_done(), 5u) << read(log);
  ASSERT_LT(steps_done(), 40u) << "the run ended before the fault";
  const auto fault_at = Clock::now();
  if (fault == "link_down") c.on("link 2 down");
  if (fault == "host_killed") c.on("kill 2");
  if (fault == "host_frozen") c.on("freeze 2");
  // Everything ends: mpiexec and host 1 (where it runs), and host 2 unless
  // frozen (a frozen process cannot exit; thawed, it must end at once).
  const auto bound = std::chrono::seconds(kTimeout + 60);
  while (Clock::now() - fault_at < bound && (!fs::exists(rc) || !c.live(1).empty() ||
                                             (fault != "host_frozen" && !c.live(2).empty())))
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double seconds = std::chrono::duration<double>(Clock::now() - fault_at).count();
  EXPECT_TRUE(fs::exists(rc)) << "mpiexec still running " << seconds << " s after the fault\n" << read(log);
  EXPECT_EQ(c.live(1), "") << "left on host 1";
  if (fault == "host_frozen") {
    c.on("thaw 2");
    for (auto start = Clock::now(); !c.live(2).empty() && Clock::now() - start < std::chrono::seconds(20);)
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(c.live(2), "") << "left on host 2";
  const std::string text = read(log);
  EXPECT_NE(std::stoi(read(rc)), 0) << text;
  // A killed host's sockets close at once: Open MPI ends the job before any
  // watchdog fires, with its own message, which names the host only at times
  // ("lost communication with a remote daemon ... on node 10.77.0.2", or
  // "unable to reliably start one or more daemons").
  if (fault != "host_killed") {
    EXPECT_NE(text.find("watchdog"), std::string::npos) << text;
    EXPECT_NE(text.find("collective_timeout_seconds"), std::string::npos) << text;
    EXPECT_NE(text.find("10.77.0.2"), std::string::npos) << "the unreachable host is not named:\n" << text;
  }
  std::printf("[ %s ] every process ended %.1f s after the fault (bound %d s)\n", fault.c_str(), seconds,
              kTimeout + 60);

  // Resume: on the same two hosts, then the last stretch again on one host (two ranks there).
  if (fault == "link_down") c.on("link 2 up");
  const CommandResult again = run_command("timeout 300 " + c.mpiexec("-n 2 " + train(out, patient)));
  ASSERT_EQ(again.status, 0) << again.output;
  ASSERT_NE(again.output.find("resumed from"), std::string::npos) << again.output;
  const auto got = losses(out / "metrics.jsonl");  // a step run twice: its resumed loss
  ASSERT_EQ(got.rbegin()->first, 40);
  for (const auto& [step, loss] : got) EXPECT_EQ(loss, want.at(step)) << "step " << step << " after resuming";
  fs::remove_all(out / "run" / "checkpoints" / "step_00000040");
  fs::remove(out / "metrics.jsonl");
  const CommandResult one_host =
      run_command("timeout 300 " + c.mpiexec("-n 2 --host 10.77.0.1:2 " + train(out, patient)));
  ASSERT_EQ(one_host.status, 0) << one_host.output;
  const auto last = losses(out / "metrics.jsonl");
  ASSERT_FALSE(last.empty()) << one_host.output;
  for (const auto& [step, loss] : last) EXPECT_EQ(loss, want.at(step)) << "step " << step << " on one host";
  EXPECT_EQ(c.down_leftovers(), "");
}

INSTANTIATE_TEST_SUITE_P(Faults, ClusterFault, testing::Values("link_down", "host_killed", "host_frozen"));

// A link that drops for less than collective_timeout_seconds leaves the run going.
TEST(Cluster, ALinkFlapShorterThanTheTimeoutLeavesTheRunGoing) {
  TempDir t;
  Cluster c(t.path, 2, 1);
  CLUSTER_OR_SKIP(c);
  const fs::path out = t.path / "flap", log = t.path / "flap.log", rc = t.path / "flap.rc";
  run_command("( timeout 300 " +
              c.mpiexec("-n 2 " + train(out, "max_target_length=2048 steps=60 enable_checkpointing=false "
                                             "ici_context_parallelism=2 context_parallel_strategy=ring "
                                             "collective_timeout_seconds=10")) +
              " > " + shell_quote(log.string()) + " 2>&1; echo $? > " + shell_quote(rc.string()) + " ) > /dev/null 2>&1 &");
  for (auto start = Clock::now(); !fs::exists(out / "metrics.jsonl") && Clock::now() - start < std::chrono::seconds(120);)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  c.on("link 2 down");
  std::this_thread::sleep_for(std::chrono::seconds(3));
  c.on("link 2 up");
  // The cut fell inside the run (every step of ring cp=2 crosses the link).
  ASSERT_FALSE(fs::exists(rc)) << "the run ended before the link came back\n" << read(log);
  ASSERT_LT(losses(out / "metrics.jsonl").size(), 60u);
  for (auto start = Clock::now(); !fs::exists(rc) && Clock::now() - start < std::chrono::seconds(280);)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(fs::exists(rc)) << read(log);
  EXPECT_EQ(std::stoi(read(rc)), 0) << read(log);
  EXPECT_EQ(losses(out / "metrics.jsonl").size(), 60u) << read(log);
}

// `down` ends every process left on the hosts, frozen ones too, and removes
// the hosts: a job across both, host 2 frozen, then down.
TEST(Cluster, DownEndsEveryProcessAndRemovesTheHosts) {
  TempDir t;
  Cluster c(t.path, 2, 1);
  CLUSTER_OR_SKIP(c);
  const fs::path log = t.path / "job.log";
  run_command("( timeout 120 " + c.mpiexec("-n 2 --map-by node sleep 100") + " > " + shell_quote(log.string()) +
              " 2>&1 ) > /dev/null 2>&1 &");
  // Up when host 2 has its sleep (started by an orted there).
  for (auto start = Clock::now(); c.live(2).find("sleep") == std::string::npos && Clock::now() - start < std::chrono::seconds(60);)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_NE(c.live(2).find("sleep"), std::string::npos) << read(log);
  ASSERT_NE(c.live(1).find("mpiexec"), std::string::npos);
  c.on("freeze 2");
  EXPECT_EQ(c.down_leftovers(), "");
}

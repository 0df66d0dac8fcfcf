// The reliability probe's defects (issue 24, D1-D9) and the start-up
// checks every rank makes before step 1, each reproduced as the probe found
// it: every test here failed before its fix.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm/mesh.h"
#include "core/crc32.h"
#include "train/checkpoint.h"
#include "train/eval.h"
#include "train/trainer.h"
#include "error_text.h"
#include "run_command.h"
#include "temp_dir.h"
#include "train_run.h"

namespace fs = std::filesystem;
using namespace longctx;
using longctx::test::one_rank;
using json = nlohmann::json;

namespace {

RunConfig tiny_run(const fs::path& checkpoints, std::map<std::string, ConfigValue> extra = {}) {
  std::map<std::string, ConfigValue> v = {
      {"base_emb_dim", int64_t(32)},       {"base_num_query_heads", int64_t(2)}, {"base_num_kv_heads", int64_t(1)},
      {"head_dim", int64_t(16)},           {"base_mlp_dim", int64_t(48)},        {"base_num_decoder_layers", int64_t(1)},
      {"dataset_type", std::string("synthetic")}, {"max_target_length", int64_t(16)},
      {"checkpoint_dir", checkpoints.string()},   {"peak_tflops_per_device", 1.0}};
  for (auto& [k, x] : extra) v[k] = x;
  return config_from_values(v);
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// Replaces a checkpoint file and records its new size and CRC-32 in
// MANIFEST.json: damage the checksums cannot see.
void rewrite_with_manifest(const fs::path& checkpoint, const std::string& file, const std::string& bytes) {
  write(checkpoint / file, bytes);
  json manifest = json::parse(read(checkpoint / "MANIFEST.json"));
  manifest["files"][file] = {{"bytes", bytes.size()}, {"crc32", crc32(bytes.data(), bytes.size())}};
  write(checkpoint / "MANIFEST.json", manifest.dump(2) + "\n");
}

// How many of the processes `pids` (separated by spaces) still run: a
// process that has exited but not been reaped (state Z) is gone.
int still_running(const std::string& pids) {
  int n = 0;
  std::istringstream in(pids);
  for (std::string pid; in >> pid;) {
    const std::string stat = read("/proc/" + pid + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z') ++n;
  }
  return n;
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The message of whatever f throws ("" when nothing).
template <typename F>
std::string error_of(F f) {
  return error_text<std::exception>(f);
}

// stderr of f (the Trainer's warnings), as text.
std::string stderr_of(const std::function<void()>& f) {
  testing::internal::CaptureStderr();
  f();
  return testing::internal::GetCapturedStderr();
}

}  // namespace

// D1: load_parameters_path at a longctx checkpoint checks its MANIFEST as
// resume does, in train and eval.
TEST(ProbeDefects, D1CorruptWeightsAtLoadParametersPathAreRefused) {
  TempDir t;
  Trainer(tiny_run(t.path / "a", {{"steps", int64_t(1)}}), one_rank()).run(nullptr);
  const fs::path step = t.path / "a" / "step_00000001";
  RunConfig load = tiny_run(t.path / "b", {{"load_parameters_path", step.string()},
                                           {"enable_checkpointing", false}, {"steps", int64_t(1)}});
  EXPECT_EQ(error_of([&] { Trainer(load, one_rank()); }), "");  // the intact one loads

  std::string bytes = read(step / "model.safetensors");
  bytes[bytes.size() - 10] ^= 0x01;  // one byte near the end: a weight, not the header
  write(step / "model.safetensors", bytes);
  for (const std::string& e : {error_of([&] { Trainer(load, one_rank()); }),
                               error_of([&] { evaluate(load, one_rank()); })}) {
    EXPECT_NE(e.find("load_parameters_path"), std::string::npos) << e;
    EXPECT_NE(e.find("CRC-32"), std::string::npos) << e;
  }
  fs::remove(step / "MANIFEST.json");
  const std::string e = error_of([&] { Trainer(load, one_rank()); });
  EXPECT_NE(e.find("without MANIFEST.json"), std::string::npos) << e;
}

// D2: resume=false never overwrites or prunes checkpoints already there.
TEST(ProbeDefects, D2ResumeFalseRefusesADirectoryThatHoldsCheckpoints) {
  TempDir t;
  const fs::path dir = t.path / "ckpt";
  Trainer(tiny_run(dir, {{"steps", int64_t(2)}, {"checkpoint_period", int64_t(1)}}), one_rank()).run(nullptr);
  const std::string one = read(dir / "step_00000001" / "model.safetensors");
  const std::string two = read(dir / "step_00000002" / "model.safetensors");
  RunConfig other = tiny_run(dir, {{"steps", int64_t(2)}, {"resume", false}, {"init_weights_seed", int64_t(9)},
                                   {"max_num_checkpoints_to_keep", int64_t(1)}});
  std::string e;
  try {
    Trainer(other, one_rank()).run(nullptr);
  } catch (const ConfigError& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("resume=false"), std::string::npos) << e;
  EXPECT_NE(e.find("overwrite"), std::string::npos) << e;
  EXPECT_EQ(read(dir / "step_00000001" / "model.safetensors"), one);
  EXPECT_EQ(read(dir / "step_00000002" / "model.safetensors"), two);
  // A step directory without MANIFEST.json counts as theirs too.
  TempDir t2;
  fs::create_directories(t2.path / "step_00000005");
  EXPECT_NE(error_of([&] { Trainer(tiny_run(t2.path, {{"resume", false}}), one_rank()).run(nullptr); })
                .find("resume=false"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(t2.path / "step_00000005"));
}

// D3: a metrics line or an eval result that cannot be written fails the run.
TEST(ProbeDefects, D3FailedWritesOfMetricsAndEvalOutputAreErrors) {
  TempDir t;
  RunConfig c = tiny_run(t.path, {{"steps", int64_t(1)}, {"enable_checkpointing", false},
                                  {"metrics_file", std::string("/dev/full")}});
  std::string e;
  try {
    Trainer(c, one_rank()).run(nullptr);
  } catch (const DataError& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("metrics_file '/dev/full'"), std::string::npos) << e;

  const std::string eval = shell_quote(LONGCTX_BINARY) + " eval " + shell_quote(LONGCTX_SOURCE_DIR "/configs/base.yml") +
                           " model_name=tiny dataset_type=synthetic max_target_length=64 eval_steps=1 "
                           "base_output_directory=" + shell_quote(t.path.string()) + " eval_output=";
  for (const std::string& out : {std::string("/dev/full"), t.path.string(), std::string("/proc/version")}) {
    const CommandResult r = run_command("OMP_NUM_THREADS=1 timeout 120 " + eval + shell_quote(out));
    EXPECT_NE(r.status, 0) << out << "\n" << r.output;
    EXPECT_NE(r.output.find("eval_output '" + out + "'"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("wrote"), std::string::npos) << r.output;
  }
  // plot_eval.py refuses what is not a regular file rather than read /dev/full forever.
  std::string python;  // as apps/eval.cpp picks it
  for (std::string py : {"python3", "/usr/bin/python3"})
    if (python.empty() && run_command(py + " -c 'import matplotlib'").status == 0) python = py;
  if (python.empty()) GTEST_SKIP() << "no python3 with matplotlib: scripts/plot_eval.py's refusal is untested";
  const CommandResult plot = run_command("timeout 60 " + python + " " + shell_quote(LONGCTX_SOURCE_DIR "/scripts/plot_eval.py") +
                                         " /dev/full -o " + shell_quote((t.path / "x.png").string()));
  EXPECT_NE(plot.status, 0) << plot.output;
  EXPECT_NE(plot.output.find("not a regular file"), std::string::npos) << plot.output;
}

// plan's integer flags below their minimum are refused with the flag's name:
// --devices 0 and -3 once planned the config's own mesh, silently.
TEST(ProbeDefects, PlanFlagsBelowTheirMinimumAreRefused) {
  const std::string plan = shell_quote(LONGCTX_BINARY) + " plan " + shell_quote(LONGCTX_SOURCE_DIR "/configs/demo.yml");
  for (const char* flag : {"--devices 0", "--devices -3", "--granule 0 --longest", "--steps 0 --validate"}) {
    const CommandResult r = run_command("OMP_NUM_THREADS=1 timeout 120 " + plan + " " + flag);
    const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
    EXPECT_NE(r.status, 0) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find("plan: " + name + " must be >= 1"), std::string::npos) << flag << "\n" << r.output;
  }
}

// D4: a newest checkpoint whose checksums agree but that fails a structural
// check is skipped, loudly, for the older valid one.
TEST(ProbeDefects, D4ResumeFallsBackPastStructuralFailures) {
  const std::vector<std::pair<std::string, std::function<std::string(std::string)>>> damage = {
      {"train_state.json", [](std::string) { return std::string(R"({"step": 4, "data_cursor": -7, "init_weights_seed": 0, "optimizer_step": 4})"); }},
      {"model.safetensors", [](std::string b) { return b.substr(0, b.size() - 64); }},  // truncated
      {"model.safetensors", [](std::string b) {  // a header naming another dtype
         const size_t at = b.find("\"F32\"");
         return at == std::string::npos ? b : b.replace(at, 5, "\"I64\"");
       }}};
  for (const auto& [file, change] : damage) {
    SCOPED_TRACE(file);
    TempDir t;
    Trainer(tiny_run(t.path, {{"steps", int64_t(4)}, {"checkpoint_period", int64_t(2)}}), one_rank()).run(nullptr);
    const fs::path four = t.path / "step_00000004";
    rewrite_with_manifest(four, file, change(read(four / file)));
    verify_checkpoint(four.string());  // the checksums cannot see it
    Trainer trainer(tiny_run(t.path), one_rank());
    std::string resumed;
    const std::string warned = stderr_of([&] { resumed = trainer.resume(); });
    EXPECT_EQ(resumed, (t.path / "step_00000002").string());
    EXPECT_EQ(trainer.step(), 2);
    EXPECT_NE(warned.find("skipping checkpoint " + four.string()), std::string::npos) << warned;
  }
}

// D5: weights that diverged finitely (1e29) are saved, but the checkpoint
// before them is never pruned until a step has run from them; the error
// names the value that is not finite.
TEST(ProbeDefects, D5AFiniteDivergenceKeepsTheLastGoodCheckpoint) {
  TempDir t;
  std::map<std::string, ConfigValue> run = {{"steps", int64_t(2)}, {"checkpoint_period", int64_t(1)},
                                            {"max_num_checkpoints_to_keep", int64_t(1)}};
  Trainer(tiny_run(t.path, run), one_rank()).run(nullptr);
  const std::string good = read(t.path / "step_00000002" / "model.safetensors");
  run["learning_rate"] = 1e30;
  run["warmup_steps_fraction"] = 0.0;
  run["steps"] = int64_t(8);
  std::string e;
  try {
    Trainer(tiny_run(t.path, run), one_rank()).run(nullptr);
  } catch (const Error& x) {
    e = x.what();
  }
  ASSERT_NE(e.find("non-finite"), std::string::npos) << e;
  EXPECT_NE(e.find("non-finite gradient norm"), std::string::npos) << e;
  EXPECT_EQ(e.find("non-finite loss"), std::string::npos) << "the loss was finite: " << e;
  ASSERT_TRUE(fs::exists(t.path / "step_00000002")) << "the last good checkpoint was pruned";
  EXPECT_EQ(read(t.path / "step_00000002" / "model.safetensors"), good);
  EXPECT_TRUE(fs::exists(t.path / "step_00000003"));  // the finite but diverged one
}

// D7: a checkpoint_dir that cannot hold checkpoints is refused before step 1.
TEST(ProbeDefects, D7ABadCheckpointDirIsFoundBeforeTraining) {
  TempDir t;
  const fs::path file = t.write("a_file", "x");
  std::string e = error_of([&] { Trainer(tiny_run(file), one_rank()); });
  EXPECT_NE(e.find("checkpoint_dir '" + file.string() + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("cannot be made a directory"), std::string::npos) << e;

  const fs::path ro = t.path / "ro";
  fs::create_directories(ro);
  if (::mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=64k") != 0)
    GTEST_SKIP() << "cannot mount a read-only tmpfs here (" << std::strerror(errno) << "): the read-only case is untested";
  e = error_of([&] { Trainer(tiny_run(ro / "ckpt"), one_rank()); });
  ::umount(ro.c_str());
  EXPECT_NE(e.find("checkpoint_dir '" + (ro / "ckpt").string() + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("Read-only file system"), std::string::npos) << e;
}

// D8: an evaluation reads each sequence at most once.
TEST(ProbeDefects, D8EvalIsBoundedByItsData) {
  TempDir t;
  for (int64_t steps : {int64_t(1000), int64_t(1000000000)}) {
    const std::string e = error_of([&] { evaluate(tiny_run(t.path, {{"eval_steps", steps}}), one_rank()); });
    EXPECT_NE(e.find("eval_steps " + std::to_string(steps)), std::string::npos) << e;
    EXPECT_NE(e.find("at most once"), std::string::npos) << e;
  }
  EXPECT_EQ(error_of([&] { evaluate(tiny_run(t.path, {{"eval_steps", int64_t(2)}}), one_rank()); }), "");
}

// D9: step directories without MANIFEST.json are reported; with no complete
// checkpoint beside them the run refuses to start over.
TEST(ProbeDefects, D9AStepDirectoryWithoutManifestIsNeverASilentStartOver) {
  TempDir t;
  fs::create_directories(t.path / "step_00000003");
  std::string e;
  const std::string warned = stderr_of([&] {
    e = error_of([&] { Trainer(tiny_run(t.path, {{"steps", int64_t(1)}}), one_rank()).run(nullptr); });
  });
  EXPECT_NE(e.find("no complete checkpoint"), std::string::npos) << e;
  EXPECT_NE(warned.find("step_00000003: no MANIFEST.json"), std::string::npos) << warned;
  EXPECT_EQ(entries(t.path), std::vector<std::string>{"step_00000003"});  // nothing written
}

// Start-up checks across ranks: every rank runs the same binary and config,
// and checkpoint_dir is one directory for all of them. Two ranks, each
// started by its own mpiexec app context.
TEST(ProbeDefects, RanksWithAnotherConfigOrCheckpointDirAreRefusedBeforeStep1) {
  TempDir t;
  const std::string exe = shell_quote(LONGCTX_BINARY);
  const std::string run = " train " + shell_quote(LONGCTX_SOURCE_DIR "/configs/base.yml") +
                          " model_name=tiny dataset_type=synthetic max_target_length=64 steps=1 ici_data_parallelism=2 "
                          "collective_timeout_seconds=60 base_output_directory=" + shell_quote(t.path.string());
  const std::string mpi = "OMP_NUM_THREADS=1 timeout 120 mpiexec --oversubscribe --allow-run-as-root --bind-to none ";
  CommandResult r = run_command(mpi + "-n 1 " + exe + run + " learning_rate=0.001 : -n 1 " + exe + run + " learning_rate=0.002");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("same longctx binary with the same config"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1's config"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1 |"), std::string::npos) << "trained before refusing:\n" << r.output;

  // Rank 1 sees its own private checkpoint_dir (a tmpfs over the same path
  // in a mount namespace of its own), as a per-host local disk would give.
  const fs::path ckpt = t.path / "shared";
  fs::create_directories(ckpt);
  if (run_command("unshare -m true").status != 0) GTEST_SKIP() << "no mount namespaces here: the per-host case is untested";
  const std::string args = run + " checkpoint_dir=" + shell_quote(ckpt.string());
  r = run_command(mpi + "-n 1 " + exe + args + " : -n 1 unshare -m sh -c " +
                  shell_quote("mount -t tmpfs none " + shell_quote(ckpt.string()) + " && exec " + exe + args));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("must be the same directory on every host"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 is not rank 0's"), std::string::npos) << r.output;
  EXPECT_TRUE(entries(ckpt).empty()) << "the marker was left behind";

  // Without checkpointing nothing is written, but a resume must still see
  // the same checkpoints on every rank: rank 0 has one, rank 1 none.
  Trainer(tiny_run(ckpt, {{"steps", int64_t(1)}}), one_rank()).run(nullptr);
  const std::string resume = args + " enable_checkpointing=false steps=2";
  r = run_command(mpi + "-n 1 " + exe + resume + " : -n 1 unshare -m sh -c " +
                  shell_quote("mount -t tmpfs none " + shell_quote(ckpt.string()) + " && exec " + exe + resume));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("holds other checkpoints on some ranks"), std::string::npos) << r.output;
}

// D6: no rank outlives its mpiexec. A scheduler starts the next job once
// mpiexec has exited (SIGTERM and its 2 s of SIGCONT, SIGTERM, SIGKILL to
// the ranks, or mpiexec killed outright), so from then on nothing of this
// job may change: the checkpoints listed by the shell that waited for
// mpiexec, as soon as it returned, are all there ever are, and its ranks
// are gone. Open MPI alone left a rank of a killed mpiexec running for
// about 1 s (until it noticed the lost PMIx server), long enough to write
// or prune a checkpoint; the ranks write one every step here.
class D6 : public testing::TestWithParam<std::string> {};

TEST_P(D6, NothingOfTheJobChangesAfterItsMpiexecHasExited) {
  TempDir t;
  const fs::path log = t.path / "job.log", ckpt = t.path / "ckpt", pid = t.path / "mpiexec.pid",
                 at_exit = t.path / "at_exit";
  const std::string ls = "ls " + shell_quote(ckpt.string()) + " 2>&1";
  const std::string job = "OMP_NUM_THREADS=1 mpiexec --oversubscribe --allow-run-as-root --bind-to none -n 2 " +
                          shell_quote(LONGCTX_BINARY) + " train " + shell_quote(LONGCTX_SOURCE_DIR "/configs/base.yml") +
                          " model_name=tiny dataset_type=synthetic max_target_length=2048 ici_data_parallelism=2 "
                          "steps=100000 log_period=1 checkpoint_period=1 max_num_checkpoints_to_keep=2 checkpoint_dir=" +
                          shell_quote(ckpt.string()) + " base_output_directory=" + shell_quote(t.path.string());
  run_command("( " + job + " > " + shell_quote(log.string()) + " 2>&1 & m=$!; echo $m > " + shell_quote(pid.string()) +
              "; wait $m; " + ls + " > " + shell_quote(at_exit.string()) + ") > /dev/null 2>&1 &");
  for (int i = 0; i < 600 && read(log).find("step 3 |") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string mpiexec = read(pid).substr(0, read(pid).find('\n'));
  const std::string ranks = run_command("pgrep -P " + mpiexec + " longctx | tr '\\n' ' '").output;
  ASSERT_NE(ranks.find(' '), std::string::npos) << "no ranks found under mpiexec " << mpiexec << "\n" << read(log);
  run_command("kill -" + GetParam() + " " + mpiexec);
  for (int i = 0; i < 300 && read(at_exit).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_FALSE(read(at_exit).empty()) << "mpiexec still running 30 s after SIG" << GetParam() << "\n" << read(log);
  // Longer than Open MPI's own 1 s, and than a step and a checkpoint.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_EQ(run_command(ls).output, read(at_exit)) << "checkpoints changed after mpiexec exited\n" << read(log);
  EXPECT_EQ(still_running(ranks), 0) << "ranks " << ranks << "outlived their mpiexec by 3 s";
  run_command("kill -KILL " + ranks + " 2>/dev/null");
}

INSTANTIATE_TEST_SUITE_P(ProbeDefects, D6, testing::Values("KILL", "TERM"));

// train_state.json: the input is the file's text.
#include "fuzz_util.h"
#include "train/checkpoint_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::allow_project_errors([&] {
    const longctx::SavedTrainState s =
        longctx::parse_train_state(std::string(reinterpret_cast<const char*>(data), size), "train_state.json");
    constexpr int64_t kMax = int64_t(1) << 53;
    fuzz::require(s.state.step >= 0 && s.state.step <= kMax && s.state.data_cursor >= 0 &&
                      s.state.data_cursor <= kMax && s.state.init_weights_seed >= 0 && s.optimizer_step >= 0 &&
                      s.optimizer_step <= s.state.step,
                  "every field in range");
  });
  return 0;
}

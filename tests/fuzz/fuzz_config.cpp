// Config layering: the input is a recipe, optionally a base file, a model
// file and command-line overrides (parts split by "\n#~~\n"): config.yml,
// base.yml, model/m.yml in a fresh directory, then one key=value per line of
// the fourth part; load_config + validate_config at three world sizes. A config
// that loads must survive its own to_yaml() round trip.
#include <algorithm>
#include <cstdint>

#include "core/config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_files(std::string(reinterpret_cast<const char*>(data), size));
  const auto dir = fuzz::scratch_dir();
  const std::string recipe = fuzz::write_file(dir / "config.yml", parts[0]).string();
  if (parts.size() > 1) fuzz::write_file(dir / "base.yml", parts[1]);
  if (parts.size() > 2) fuzz::write_file(dir / "model" / "m.yml", parts[2]);
  std::vector<std::string> overrides;
  if (parts.size() > 3)
    for (size_t start = 0, end; start <= parts[3].size(); start = end + 1) {
      end = std::min(parts[3].find('\n', start), parts[3].size());
      if (end > start) overrides.push_back(parts[3].substr(start, end - start));
    }
  fuzz::allow_project_errors([&] {
    longctx::RunConfig c = longctx::load_config(recipe, overrides);
    const std::string yaml = c.to_yaml();
    const auto values = c.values();
    longctx::RunConfig back = longctx::load_config(fuzz::write_file(dir / "dump.yml", yaml).string());
    fuzz::require(back.values() == values, "to_yaml() reloads to the same values");
    for (int64_t world : {1, 4, 8}) {
      longctx::RunConfig v = c;
      fuzz::allow_project_errors([&] { longctx::validate_config(v, world); });
    }
  });
  return 0;
}

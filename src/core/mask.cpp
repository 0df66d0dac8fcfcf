#include "core/mask.h"

namespace longctx {

MaskSpec MaskSpec::full() { return MaskSpec{Kind::full, 0, 0, 0, false}; }
MaskSpec MaskSpec::causal() { return MaskSpec{Kind::causal, 0, 0, 0, false}; }
MaskSpec MaskSpec::local(int64_t left, int64_t right) {
  if (left < 0 || right < 0) throw ConfigError("local mask: window sides must be >= 0");
  return MaskSpec{Kind::local, left, right, 0, false};
}
MaskSpec MaskSpec::chunked(int64_t chunk) {
  if (chunk <= 0) throw ConfigError("chunked mask: chunk size must be > 0");
  return MaskSpec{Kind::chunked, 0, 0, chunk, false};
}

MaskSpec MaskSpec::parse(const std::string& text) {
  std::string t = text;
  bool segments = false;
  const std::string suffix = "+segments";
  if (t.size() > suffix.size() && t.compare(t.size() - suffix.size(), suffix.size(), suffix) == 0) {
    segments = true;
    t = t.substr(0, t.size() - suffix.size());
  }
  auto number = [&](const std::string& s) -> int64_t {
    try {
      size_t used = 0;
      long long v = std::stoll(s, &used);
      if (used != s.size()) throw ConfigError("");
      return v;
    } catch (...) {
      throw ConfigError("mask '" + text + "': '" + s + "' is not an integer");
    }
  };
  MaskSpec m;
  if (t == "full") {
    m = full();
  } else if (t == "causal") {
    m = causal();
  } else if (t.rfind("local:", 0) == 0) {
    std::string rest = t.substr(6);
    size_t colon = rest.find(':');
    if (colon == std::string::npos) {
      int64_t w = number(rest);
      if (w < 1) throw ConfigError("mask '" + text + "': window must be >= 1");
      m = local(w - 1, 0);
    } else {
      m = local(number(rest.substr(0, colon)), number(rest.substr(colon + 1)));
    }
  } else if (t.rfind("chunked:", 0) == 0) {
    m = chunked(number(t.substr(8)));
  } else {
    throw ConfigError("unknown mask '" + text +
                      "': expected full, causal, local:W, local:L:R or chunked:C, "
                      "optionally with +segments");
  }
  m.same_segment = segments;
  return m;
}

std::string MaskSpec::to_string() const {
  std::string s = name_of(kind);  // the one name table (core/vocabulary.h), then the kind's parameters
  if (kind == Kind::local) s += ":" + std::to_string(left) + ":" + std::to_string(right);
  if (kind == Kind::chunked) s += ":" + std::to_string(chunk);
  return same_segment ? s + "+segments" : s;
}

}  // namespace longctx

#pragma once
// Which (q, kv) pairs may attend: the attention kernel, every context-parallel
// strategy, the data loader and the planner share this one description.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/vocabulary.h"

namespace longctx {

// Which (q, kv) pairs may attend. Positions are global token positions.
struct MaskSpec {
  using Kind = MaskKind;  // attention_type
  Kind kind = Kind::causal;
  // local: kv_pos in [q_pos - left, q_pos + right]. causal == local(inf, 0).
  int64_t left = 0, right = 0;
  // chunked: q and kv in the same block of `chunk` positions, and causal
  // (Llama 4 style chunked attention).
  int64_t chunk = 0;
  // AND-ed: q and kv must have the same segment id (packed documents).
  bool same_segment = false;

  static MaskSpec full();
  static MaskSpec causal();
  static MaskSpec local(int64_t left, int64_t right);
  static MaskSpec chunked(int64_t chunk);
  // "full", "causal", "local:W" (causal window of W tokens: left = W - 1,
  // right = 0), "local:L:R", "chunked:C"; a "+segments" suffix sets
  // same_segment. Throws ConfigError on anything else.
  static MaskSpec parse(const std::string& text);
  std::string to_string() const;

  bool allows(int64_t q_pos, int64_t kv_pos) const {
    switch (kind) {
      case Kind::full: return true;
      case Kind::causal: return kv_pos <= q_pos;
      case Kind::local: return kv_pos >= q_pos - left && kv_pos <= q_pos + right;
      case Kind::chunked: return kv_pos <= q_pos && q_pos / chunk == kv_pos / chunk;
    }
    return false;
  }
  bool allows(int64_t q_pos, int64_t kv_pos, int32_t q_seg, int32_t kv_seg) const {
    return (!same_segment || q_seg == kv_seg) && allows(q_pos, kv_pos);
  }
};

}  // namespace longctx

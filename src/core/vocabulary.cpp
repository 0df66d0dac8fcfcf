#include "core/vocabulary.h"

namespace longctx {

SaveSet save_set_for(RematPolicy policy, const CustomSave& s, const CustomOffload& offload) {
  switch (policy) {
    case RematPolicy::none: return {true, true, true, true};
    case RematPolicy::minimal: return {true, false, true, true};
    case RematPolicy::save_context: return {false, true, false, false};
    case RematPolicy::full: return {false, false, false, false};
    case RematPolicy::custom:
      if (!s[static_cast<int>(SavePoint::decoder_layer_input)])
        throw ConfigError(
            "remat_policy=custom needs decoder_layer_input: device (the layer input is the recompute boundary)");
      SaveSet out{s[static_cast<int>(SavePoint::qkv_proj)], s[static_cast<int>(SavePoint::context)],
                  s[static_cast<int>(SavePoint::out_proj)], s[static_cast<int>(SavePoint::mlpwi)]};
      for (int i = 0; i < kNumSavePoints; ++i) out.offload[i] = s[i] && offload[i] && i != int(SavePoint::mlpwo);
      return out;
  }
  return {};
}

}  // namespace longctx

#pragma once
// The words the configuration, the engine and the planner share: one enum per
// choice, one name table per enum, one parser for all of them. The
// configuration (core/config.h) parses each name once, when it is read;
// everything after that passes the enums.
//
//   parse_enum<CpStrategy>("ring")   -> CpStrategy::ring   (ConfigError naming the choices)
//   name_of(CpStrategy::ring)        -> "ring"
#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "core/error.h"

namespace longctx {

// Specialised once per enum below: `what` (the config key or the thing it
// names, for errors) and `names`, canonical name first for each value, then
// any accepted aliases.
template <typename E>
struct EnumNames;

template <typename E>
const char* name_of(E value) {
  for (const auto& [v, name] : EnumNames<E>::names)
    if (v == value) return name;
  return "?";
}

// "a|b|c": the canonical names, in table order.
template <typename E>
std::string enum_choices() {
  std::string out;
  for (const auto& [v, name] : EnumNames<E>::names) {
    if (name_of(v) != name) continue;  // an alias
    out += (out.empty() ? "" : "|") + std::string(name);
  }
  return out;
}

template <typename E>
E parse_enum(const std::string& text) {
  for (const auto& [v, name] : EnumNames<E>::names)
    if (text == name) return v;
  throw ConfigError("unknown " + std::string(EnumNames<E>::what) + " '" + text + "': expected " +
                    enum_choices<E>());
}

// ---- the choices ----------------------------------------------------------------

enum class DType { f32, bf16 };
template <>
struct EnumNames<DType> {
  static constexpr const char* what = "dtype";
  static constexpr std::array<std::pair<DType, const char*>, 4> names{
      {{DType::f32, "float32"}, {DType::f32, "fp32"}, {DType::bf16, "bfloat16"}, {DType::bf16, "bf16"}}};
};
inline size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

// What a hardware profile's devices are (YAML `platform`): what the
// frameworks whose settings `plan --emit` writes decide by (MaxText's
// `hardware`, the attention kernel, which strategies they run).
enum class Platform { cpu, gpu, tpu };
template <>
struct EnumNames<Platform> {
  static constexpr const char* what = "platform";
  static constexpr std::array<std::pair<Platform, const char*>, 3> names{
      {{Platform::cpu, "cpu"}, {Platform::gpu, "gpu"}, {Platform::tpu, "tpu"}}};
};

// The frameworks `plan --emit` writes settings for (src/plan/emit.h).
enum class Framework { maxtext, megatron, torchtitan };
template <>
struct EnumNames<Framework> {
  static constexpr const char* what = "framework (plan --emit)";
  static constexpr std::array<std::pair<Framework, const char*>, 3> names{
      {{Framework::maxtext, "maxtext"}, {Framework::megatron, "megatron"}, {Framework::torchtitan, "torchtitan"}}};
};

// attention_type: which (q, kv) pairs may attend (core/mask.h).
enum class MaskKind { full, causal, local, chunked };
template <>
struct EnumNames<MaskKind> {
  static constexpr const char* what = "attention_type";
  static constexpr std::array<std::pair<MaskKind, const char*>, 4> names{
      {{MaskKind::full, "full"}, {MaskKind::causal, "causal"}, {MaskKind::local, "local"},
       {MaskKind::chunked, "chunked"}}};
};

// context_parallel_strategy (src/cp/cp_attention.h).
enum class CpStrategy { all_gather, ulysses, ring, usp };
template <>
struct EnumNames<CpStrategy> {
  static constexpr const char* what = "context_parallel_strategy";
  static constexpr std::array<std::pair<CpStrategy, const char*>, 4> names{
      {{CpStrategy::all_gather, "all_gather"}, {CpStrategy::ulysses, "ulysses"}, {CpStrategy::ring, "ring"},
       {CpStrategy::usp, "usp"}}};
};

// How a sequence is cut over the cp ranks (src/cp/layout.h):
// context_parallel_load_balance true = zigzag.
enum class LayoutKind { contiguous, zigzag };
template <>
struct EnumNames<LayoutKind> {
  static constexpr const char* what = "layout";
  static constexpr std::array<std::pair<LayoutKind, const char*>, 2> names{
      {{LayoutKind::contiguous, "contiguous"}, {LayoutKind::zigzag, "zigzag"}}};
};

// attention_kernel: the fast kernel or the float64 reference (tests).
enum class KernelImpl { fast, reference };
template <>
struct EnumNames<KernelImpl> {
  static constexpr const char* what = "attention_kernel";
  static constexpr std::array<std::pair<KernelImpl, const char*>, 2> names{
      {{KernelImpl::fast, "fast"}, {KernelImpl::reference, "reference"}}};
};

// dataset_type (src/train/data.h).
enum class DatasetType { text, binary, synthetic };
template <>
struct EnumNames<DatasetType> {
  static constexpr const char* what = "dataset_type";
  static constexpr std::array<std::pair<DatasetType, const char*>, 3> names{
      {{DatasetType::text, "text"}, {DatasetType::binary, "binary"}, {DatasetType::synthetic, "synthetic"}}};
};

// remat_policy: what each decoder layer keeps from forward for backward; the
// rest is recomputed (MaxText's names).
//   none          save everything in SaveSet (fastest, most memory)
//   minimal       save the matmul outputs: qkv_proj, out_proj, mlpwi
//   save_context  save the attention output and its LSE only
//   full          save nothing but the layer input (least memory)
//   custom        the per-tensor choice (the keys named after SavePoint)
enum class RematPolicy { none, minimal, save_context, full, custom };
template <>
struct EnumNames<RematPolicy> {
  static constexpr const char* what = "remat_policy";
  static constexpr std::array<std::pair<RematPolicy, const char*>, 5> names{
      {{RematPolicy::none, "none"}, {RematPolicy::minimal, "minimal"},
       {RematPolicy::save_context, "save_context"}, {RematPolicy::full, "full"},
       {RematPolicy::custom, "custom"}}};
};

// The tensors a custom policy saves or recomputes, in MaxText's key names
// (each key is `device` = save, `remat` = recompute, or `offload` = save
// outside device memory, in the offload_target tier; src/model/offload.h).
enum class SavePoint { decoder_layer_input, qkv_proj, context, out_proj, mlpwi, mlpwo };
constexpr int kNumSavePoints = 6;
template <>
struct EnumNames<SavePoint> {
  static constexpr const char* what = "save point";
  static constexpr std::array<std::pair<SavePoint, const char*>, 6> names{
      {{SavePoint::decoder_layer_input, "decoder_layer_input"}, {SavePoint::qkv_proj, "qkv_proj"},
       {SavePoint::context, "context"}, {SavePoint::out_proj, "out_proj"}, {SavePoint::mlpwi, "mlpwi"},
       {SavePoint::mlpwo, "mlpwo"}}};
};
// true = save, in SavePoint order. decoder_layer_input must be saved (the
// layer input is the recompute boundary); mlpwo changes nothing here (the MLP
// output only feeds the next layer's input, which is always kept).
using CustomSave = std::array<bool, kNumSavePoints>;
constexpr CustomSave kDefaultCustomSave{true, false, false, false, false, false};
// true = the saved tensor is offloaded (only for points that are saved), in
// SavePoint order. mlpwo is never stored, so offloading it changes nothing.
using CustomOffload = std::array<bool, kNumSavePoints>;

// offload_target: where offloaded saved tensors live between a layer's
// forward and its backward. host: a separately budgeted RAM pool
// (host_memory_budget); disk: spill files in offload_dir.
enum class OffloadTarget { host, disk };
template <>
struct EnumNames<OffloadTarget> {
  static constexpr const char* what = "offload_target";
  static constexpr std::array<std::pair<OffloadTarget, const char*>, 2> names{
      {{OffloadTarget::host, "host"}, {OffloadTarget::disk, "disk"}}};
};

// Where a piece of training state (the AdamW moments, the FSDP parameter
// shard) lives for the whole run (core/state_store.h): device memory, or
// with *_memory_host_offload the state_offload_target.
enum class StateTier { device, host, disk };
inline StateTier state_tier(bool offloaded, OffloadTarget target) {
  return !offloaded ? StateTier::device : target == OffloadTarget::host ? StateTier::host : StateTier::disk;
}

// What a layer keeps for backward besides its input. The model allocates its
// activation buffers from it (src/model/llama.h activation_table) and the
// planner counts memory and recompute from the same set.
struct SaveSet {
  bool qkv = false;       // q, k, v after RoPE             [N, (H+2G) D / tp]
  bool context = false;   // attention output and its LSE   [N, H D / tp], [N, H / tp]
  bool out_proj = false;  // residual after attention, x2   [N, d]
  bool mlpwi = false;     // gate/up projection output      [N, 2 F / tp]
  // Which saved tensors (decoder_layer_input = the residual stream x) leave
  // device memory between forward and backward; custom policy only.
  CustomOffload offload{};
  bool offloaded(SavePoint p) const { return offload[static_cast<int>(p)]; }
};
// ConfigError when custom does not save decoder_layer_input. `offload` is
// used by the custom policy only.
SaveSet save_set_for(RematPolicy policy, const CustomSave& custom = kDefaultCustomSave,
                     const CustomOffload& offload = {});

}  // namespace longctx

#include "model/offload.h"

#include <algorithm>

namespace longctx {

int64_t offload_staging_slots(Activation a) { return a == Activation::x ? 3 : 2; }

int offload_save_point(Activation a) {
  switch (a) {
    case Activation::x: return static_cast<int>(SavePoint::decoder_layer_input);
    case Activation::qkv: return static_cast<int>(SavePoint::qkv_proj);
    case Activation::context:
    case Activation::context_lse: return static_cast<int>(SavePoint::context);
    case Activation::out_proj: return static_cast<int>(SavePoint::out_proj);
    case Activation::mlpwi: return static_cast<int>(SavePoint::mlpwi);
    default: return -1;
  }
}

int64_t offload_stored_items(Activation a, int64_t layers) {
  const int64_t items = a == Activation::x ? layers + 1 : layers;
  return std::max<int64_t>(0, items - offload_staging_slots(a));
}

ActivationOffload::ActivationOffload(const SaveSet& save, int64_t layers, OffloadTarget target,
                                     const std::string& dir)
    : layers_(layers), store_(target, dir) {
  for (int i = 0; i < kNumActivations; ++i) {
    const Activation a = static_cast<Activation>(i);
    const int point = offload_save_point(a);
    if (point < 0 || !save.offload[point]) continue;
    Tensor& t = tensors_[i];
    t.items = a == Activation::x ? layers + 1 : layers;
    t.slots = offload_staging_slots(a);
  }
}

void ActivationOffload::bind(Activation a, const char* name, std::vector<void*> slots, size_t bytes) {
  Tensor& t = tensors_[static_cast<int>(a)];
  t.name = name;
  t.staging = std::move(slots);
  t.bytes = bytes;
  t.slot_out.assign(t.staging.size(), 0);
  t.fetch.assign(static_cast<size_t>(t.items), 0);
}

void ActivationOffload::before_forward(int64_t layer) {
  for (int i = 0; i < kNumActivations; ++i) {
    Tensor& t = tensors_[i];
    if (t.items == 0) continue;
    const int64_t written = static_cast<Activation>(i) == Activation::x ? layer + 1 : layer;  // x: the output
    OffloadStore::Ticket& out = t.slot_out[written % t.slots];
    if (out) store_.wait(out);
    out = 0;
  }
}

void ActivationOffload::after_forward(int64_t layer) {
  for (int i = 0; i < kNumActivations; ++i) {
    Tensor& t = tensors_[i];
    if (t.items == 0 || !t.stored(layer)) continue;
    const std::string name = std::string(t.name) + " of layer " + std::to_string(layer);
    t.slot_out[layer % t.slots] = store_.put(block_id(static_cast<Activation>(i), layer), name,
                                             t.staging[layer % t.slots], t.bytes);
  }
}

void ActivationOffload::fetch(Activation a, int64_t item) {
  Tensor& t = tensors_[static_cast<int>(a)];
  if (item < 0 || !t.stored(item) || t.fetch[item]) return;
  t.fetch[item] = store_.get(block_id(a, item), t.staging[item % t.slots]);
}

void ActivationOffload::before_backward(int64_t layer) {
  for (int i = 0; i < kNumActivations; ++i) {
    if (tensors_[i].items == 0) continue;
    fetch(static_cast<Activation>(i), layer);  // queued already unless this is the first stored layer
    if (tensors_[i].fetch[layer]) store_.wait(tensors_[i].fetch[layer]);
  }
  for (int i = 0; i < kNumActivations; ++i)
    if (tensors_[i].items > 0) fetch(static_cast<Activation>(i), layer - 1);  // overlaps this layer's backward
}

void ActivationOffload::finish() {
  store_.wait_all();
  for (Tensor& t : tensors_) {
    std::fill(t.slot_out.begin(), t.slot_out.end(), 0);
    std::fill(t.fetch.begin(), t.fetch.end(), 0);
  }
}

}  // namespace longctx

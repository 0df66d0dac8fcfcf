#pragma once
// Offload of saved activations (remat_policy custom, a save point set to
// `offload`): a saved per-layer tensor lives in device memory only while its
// layer runs. The model keeps a few staging buffers per tensor instead of one
// per layer (offload_staging_slots); after a layer's forward its tensor is
// queued for the OffloadStore (host pool or disk, src/core/offload_store.h),
// and before a layer's backward it is brought back, the previous layer's
// prefetched while this one runs. Moves overlap compute on the store's thread.
//
// Item i of a tensor (the layer input x[i], or layer i's qkv, ...) stays in
// staging slot i % slots. An item among the last `slots` is never overwritten
// before backward needs it, so it is neither written out nor read back
// (offload_stored_items counts the others: what the host/disk tier holds).
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "core/offload_store.h"
#include "model/llama.h"

namespace longctx {

// Staging slots of an offloaded activation: 3 for the layer input (a layer
// reads x[l], writes x[l+1], and x[l-1] may still be on its way out), 2 for
// the others (this layer's, and the previous one's on its way out).
int64_t offload_staging_slots(Activation a);
// The save point whose key offloads activation a (-1: none can).
int offload_save_point(Activation a);
// Items of activation a the store holds per step: items - slots, or 0.
// items: layers + 1 for the layer input, layers for the others.
int64_t offload_stored_items(Activation a, int64_t layers);

class ActivationOffload {
 public:
  ActivationOffload(const SaveSet& save, int64_t layers, OffloadTarget target, const std::string& dir);

  // The staging buffers of activation a in a new workspace (slot s at slots[s]).
  void bind(Activation a, const char* name, std::vector<void*> slots, size_t bytes);
  bool offloads(Activation a) const { return tensors_[static_cast<int>(a)].items > 0; }

  void before_forward(int64_t layer);   // waits until the slots this layer writes are out
  void after_forward(int64_t layer);    // queues this layer's items out
  void before_backward(int64_t layer);  // waits until this layer's items are back; prefetches the previous layer's
  void finish();                        // end of a step: waits for every move

 private:
  struct Tensor {
    const char* name = "";
    int64_t items = 0;  // 0: not offloaded
    int64_t slots = 0;
    size_t bytes = 0;
    std::vector<void*> staging;
    std::vector<OffloadStore::Ticket> slot_out;  // per slot: the put reading it
    std::vector<OffloadStore::Ticket> fetch;     // per item: its get (0: not queued)
    bool stored(int64_t item) const { return item + slots < items; }
  };
  int64_t block_id(Activation a, int64_t item) const { return static_cast<int64_t>(a) * (layers_ + 1) + item; }
  void fetch(Activation a, int64_t item);

  int64_t layers_;
  std::array<Tensor, kNumActivations> tensors_{};
  OffloadStore store_;
};

}  // namespace longctx

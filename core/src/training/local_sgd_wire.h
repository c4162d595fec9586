// What one round of LocalSgd (gyre/local_sgd.h) does to one parameter, apart
// from the collective: the pseudo-gradient into the wire buffer (in the
// parameter's dtype, 16 bits, or float32 to be quantized to int8), the
// outer optimizer's step on θ_synced from the averaged wire, the merge of
// the result into the caller's parameter, and int8's message layout,
// quantization and dequantizing average. Internal to core/src/training.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gyre/local_sgd.h"

namespace gyre::local_sgd_detail {

// One parameter: the caller's buffer and what LocalSgd keeps beside it, all
// in the parameter's dtype but for `wire` under compression (16-bit, or
// float32 for int8: the pseudo-gradient before quantization and the average
// after the round).
struct Slot {
  TensorView local;
  std::size_t count = 0;
  std::vector<std::byte> synced;    // θ_synced
  std::vector<std::byte> momentum;  // the outer optimizer's buffer (momentum > 0)
  std::vector<std::byte> wire;      // the pseudo-gradient as the collective carries it
  std::vector<std::byte> at_start;  // θ_local when a delayed round started (sync_delay > 0)
};

std::size_t wire_size(const Slot& s, LocalSgdCompression c);
DataType wire_dtype(const Slot& s, LocalSgdCompression c);

// wire = θ_synced − θ_local.
void pseudo_gradient(Slot& s, LocalSgdCompression c);
// The outer optimizer's step on θ_synced with the averaged pseudo-gradient
// in `wire` (torch.optim.SGD's update, in the parameter's dtype).
void outer_step(Slot& s, LocalSgdCompression c, const OuterOptimizer& o);
// θ_local after the round: θ_synced when no inner step was taken while it
// was in flight (`drift` false); otherwise θ_synced + (θ_local − at_start),
// or with mixing α >= 0, α·θ_local + (1 − α)·θ_synced.
void merge(Slot& s, bool drift, double mixing);

// The int8 message of one rank, one row of the round's allgather: every
// slot's values (int8, in slot order), zero bytes up to a multiple of 4,
// then every slot's block scales (float32, in slot order).
struct Int8Layout {
  std::size_t values = 0;  // int8 values in all (the parameters' elements)
  std::size_t scales = 0;  // blocks in all
  std::size_t scales_at = 0;
  std::size_t bytes = 0;
};

Int8Layout int8_layout(const std::vector<Slot*>& slots);
// Quantizes every slot's float32 `wire` into `out` (int8_layout's bytes):
// per block, scale = absmax / 127 and q = round(v / scale) in [-127, 127];
// an all-zero block has scale 0 and q 0. A block holding a NaN or an
// infinity gets a NaN scale (and q 0): its average becomes NaN on every
// rank, as it would uncompressed, instead of an arbitrary number.
void quantize(const std::vector<Slot*>& slots, const Int8Layout& l, std::byte* out);
// Every slot's `wire` = the average over the gathered rows (one per rank, in
// rank order) of their dequantized values, summed in float32 in rank order:
// the same arithmetic on every rank, so the same result.
void dequantize_average(const std::vector<Slot*>& slots, const Int8Layout& l,
                        const std::byte* rows, std::size_t ranks);

// Cut points (fragments + 1 of them) splitting parameters of these element
// counts, in order, into `fragments` non-empty runs as even as the order
// allows: cut f at the prefix sum nearest f·total/fragments (the lowest
// such index on a tie). Needs 1 <= fragments <= counts.size().
std::vector<std::size_t> fragment_cuts(const std::vector<std::size_t>& counts, int fragments);

}  // namespace gyre::local_sgd_detail

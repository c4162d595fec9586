// The message tags of a runtime's transport, all defined here, by the stage
// whose traffic comes first (the negotiation), so that no two streams can
// share one: one stream of traffic each. The ring algorithms send on `tag`
// and `tag + 1` (collectives/src/ring_pipeline.h), so each stream owns
// kTagsPerStream tags: a message of one stream can never be matched to a
// receive of another (negotiation bytes read as data, say), even by a rank
// that left a collective early.
#pragma once

namespace gyre::core {

inline constexpr int kTagsPerStream = 2;
inline constexpr int kTagNegotiate = 1;  // negotiation rounds, start-up agreement (runtime.cc)
inline constexpr int kTagData = 3;       // the host backends' collectives (backends/)
inline constexpr int kTagNcclId = 5;     // the NCCL communicator's set-up (backends/nccl/)
static_assert(kTagNegotiate + kTagsPerStream <= kTagData &&
                  kTagData + kTagsPerStream <= kTagNcclId,
              "message tags of negotiation, data and NCCL set-up must not overlap");

}  // namespace gyre::core

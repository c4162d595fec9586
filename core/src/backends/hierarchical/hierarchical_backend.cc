// HierarchicalBackend (hierarchical_backend.h).
#include "backends/hierarchical/hierarchical_backend.h"

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/shm.h"

namespace gyre::core {

void HierarchicalBackend::allreduce(const void* in, void* out, std::size_t count, DataType dt,
                                    const Reduction& red, const OpLabel&) {
  collectives::AllreduceOptions o;
  o.chunk_bytes = opt_.ring_chunk_bytes;
  o.small_bytes = opt_.allreduce_small_bytes;
  o.tag = kTagData;
  collectives::hierarchical_allreduce(host_->group(), *cross_, in, out, count, dt, red.op,
                                      red.prescale, red.postscale, o);
}

}  // namespace gyre::core

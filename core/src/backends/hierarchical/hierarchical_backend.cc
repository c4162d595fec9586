// HierarchicalBackend (hierarchical_backend.h).
#include "backends/hierarchical/hierarchical_backend.h"

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/shm.h"

namespace gyre::core {

void HierarchicalBackend::allreduce(const void* in, void* out, std::size_t count, DataType dt,
                                    const Reduction& red, const OpLabel&) {
  // The cross-host allreduce takes no scale factors of its own (see
  // hierarchical_allreduce): those of `red` are passed separately.
  collectives::hierarchical_allreduce(host_->group(), *cross_, in, out, count, dt, red.op,
                                      red.prescale, red.postscale, allreduce_options(Reduction{}));
}

}  // namespace gyre::core

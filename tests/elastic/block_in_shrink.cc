// Fault injection for the recovery deadline's test (GYRE_ELASTIC_RECOVERY_
// TIMEOUT_S): a process that loads this library with LD_PRELOAD blocks for
// ever in MPIX_Comm_shrink, as a recovery blocked inside Open MPI's ULFM
// does (docs/elastic.md, "Limits"). gyre's call resolves to this definition
// before libmpi's; nothing else calls it.
#include <mpi.h>
#include <unistd.h>

extern "C" int MPIX_Comm_shrink(MPI_Comm, MPI_Comm*) {
  for (;;) pause();  // until the job is ended from outside
}

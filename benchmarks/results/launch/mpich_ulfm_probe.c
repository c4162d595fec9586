#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int x = 1, y = 0;
  MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == size - 1) raise(SIGKILL);
  int rc = MPI_SUCCESS, tries = 0;
  for (; tries < 100000 && rc == MPI_SUCCESS; ++tries)
    rc = MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int cls = -1; MPI_Error_class(rc, &cls);
  printf("rank %d: allreduce after kill rc class %d (PROC_FAILED %d REVOKED %d) after %d tries\n", rank, cls,
         MPIX_ERR_PROC_FAILED, MPIX_ERR_REVOKED, tries);
  fflush(stdout);
  MPIX_Comm_revoke(MPI_COMM_WORLD);
  MPI_Comm shrunk;
  rc = MPIX_Comm_shrink(MPI_COMM_WORLD, &shrunk);
  int n = -1; if (rc == MPI_SUCCESS) MPI_Comm_size(shrunk, &n);
  printf("rank %d: shrink rc %d size %d\n", rank, rc, n); fflush(stdout);
  int flag = 1; rc = MPIX_Comm_agree(shrunk, &flag);
  printf("rank %d: agree rc %d flag %d\n", rank, rc, flag);
  y = 0; rc = MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, shrunk);
  printf("rank %d: allreduce on shrunk rc %d sum %d\n", rank, rc, y); fflush(stdout);
  MPI_Finalize();
  return 0;
}

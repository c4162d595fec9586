// ShmHost::create: the host's segment, named, mapped and unlinked over MPI.
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include <fmt/format.h>

#include "gyre/collectives/shm_host.h"
#include "gyre/error.h"
#include "mpi_comm.h"

namespace gyre::transport {

namespace {

constexpr int kNameBytes = 128;
constexpr std::size_t kPage = 4096;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
constexpr int kReasonBytes = 512;

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw TransportError(fmt::format("{} failed: {}", what, std::string(text, len)));
  }
}

// A name no other job (or earlier group of this one) uses: the creator's pid,
// a per-process counter and 64 random bits. O_EXCL makes a collision an
// error rather than a shared segment.
std::string fresh_name() {
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  const unsigned long long r = (static_cast<unsigned long long>(rd()) << 32) ^ rd();
  return fmt::format("/gyre-{}-{}-{:016x}", ::getpid(), counter++, r);
}

// Every rank's outcome (over the whole job, so that no host goes on while
// another failed): throws on every rank the first failure's reason.
void agree(MPI_Comm comm, const std::string& my_error) {
  std::array<char, kReasonBytes> mine{};
  std::strncpy(mine.data(), my_error.c_str(), kReasonBytes - 1);
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::string all(static_cast<std::size_t>(size) * kReasonBytes, '\0');
  check(MPI_Allgather(mine.data(), kReasonBytes, MPI_CHAR, all.data(), kReasonBytes, MPI_CHAR,
                      comm),
        "MPI_Allgather (shared memory set-up)");
  for (int r = 0; r < size; ++r) {
    const char* why = all.data() + static_cast<std::size_t>(r) * kReasonBytes;
    if (why[0] != '\0') {
      throw TransportError(fmt::format("shared memory set-up failed on rank {}: {}", r,
                                       std::string(why)));
    }
  }
}

}  // namespace

std::unique_ptr<ShmHost> ShmHost::create(const collectives::ShmOptions& opt, bool wanted) {
  return set_up(opt, wanted, true);
}

std::unique_ptr<ShmHost> ShmHost::create_per_host(const collectives::ShmOptions& opt,
                                                  bool wanted) {
  return set_up(opt, wanted, false);
}

std::unique_ptr<ShmHost> ShmHost::set_up(const collectives::ShmOptions& opt, bool wanted,
                                         bool whole_world_only) {
  // The world's communicator: MPI_COMM_WORLD, or the ranks gyre was
  // started on (MpiWorld::instance(ranks)), or the survivors after a rebuild.
  const MPI_Comm world = detail::world_comm();
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(world, &world_rank);
  MPI_Comm_size(world, &world_size);
  // Every rank wants it, with the same slot size (a difference is reported
  // by the runtime's options check; here it only means "no").
  long votes[3] = {wanted ? 1L : 0L, static_cast<long>(opt.slot_bytes),
                   static_cast<long>(opt.pool_bytes)};
  long lowest[3] = {0, 0, 0}, highest[3] = {0, 0, 0};
  check(MPI_Allreduce(votes, lowest, 3, MPI_LONG, MPI_MIN, world), "MPI_Allreduce");
  check(MPI_Allreduce(votes, highest, 3, MPI_LONG, MPI_MAX, world), "MPI_Allreduce");
  if (lowest[0] == 0 || lowest[1] != highest[1] || lowest[2] != highest[2]) return nullptr;
  MPI_Comm local;
  check(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL,
                            &local),
        "MPI_Comm_split_type");
  struct Free {
    MPI_Comm* c;
    ~Free() { MPI_Comm_free(c); }
  } free_local{&local};
  int rank = 0, size = 0;
  MPI_Comm_rank(local, &rank);
  MPI_Comm_size(local, &size);

  int all_local = size == world_size, everywhere = 0;
  check(MPI_Allreduce(&all_local, &everywhere, 1, MPI_INT, MPI_MIN, world),
        "MPI_Allreduce");
  if (whole_world_only && !everywhere) return nullptr;
  std::unique_ptr<ShmHost> host(new ShmHost());
  // Local rank 0 creates the segment; the others learn its name.
  std::array<char, kNameBytes> created{};
  std::string error;
  // The group's region, then the pool's parts on page boundaries.
  const std::size_t group_bytes =
      round_up(collectives::ShmGroup::region_bytes(size, opt.slot_bytes), kPage);
  const std::size_t part_bytes =
      opt.pool_bytes > 0 ? round_up(opt.pool_bytes + collectives::kShmPoolHeader, kPage) : 0;
  const std::size_t region = group_bytes + static_cast<std::size_t>(size) * part_bytes;
  if (rank == 0) {
    try {
      const std::string n = fresh_name();
      host->segment_ = collectives::ShmSegment::create(n, region);
      std::strncpy(created.data(), n.c_str(), kNameBytes - 1);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  check(MPI_Bcast(created.data(), kNameBytes, MPI_CHAR, 0, local),
        "MPI_Bcast (shared memory name)");
  if (rank != 0 && created[0] != '\0') {
    try {
      host->segment_ = collectives::ShmSegment::open(created.data(), region);
    } catch (const std::exception& e) {
      error = e.what();
    }
  } else if (rank != 0) {
    error = "local rank 0 could not create the segment";
  }
  // Everyone has mapped it (or failed): the name can go either way.
  agree(world, error);
  host->segment_.unlink();
  host->group_.emplace(host->segment_.data(), rank, size, opt);
  if (part_bytes > 0) {
    auto* const base = static_cast<std::byte*>(host->segment_.data()) + group_bytes;
    host->pool_ = {base, part_bytes, size};
    host->allocator_ = std::make_unique<collectives::ShmPoolAllocator>(
        host->pool_.part(rank) + collectives::kShmPoolHeader,
        part_bytes - collectives::kShmPoolHeader);
  }
  return host;
}

std::unique_ptr<ShmHost> ShmHost::attach(void* region, int rank, int size,
                                         const collectives::ShmOptions& opt,
                                         const collectives::ShmPool& pool) {
  std::unique_ptr<ShmHost> host(new ShmHost());
  host->group_.emplace(region, rank, size, opt);
  if (!pool.empty()) {
    host->pool_ = pool;
    host->allocator_ = std::make_unique<collectives::ShmPoolAllocator>(
        pool.part(rank) + collectives::kShmPoolHeader,
        pool.part_bytes - collectives::kShmPoolHeader);
  }
  return host;
}

}  // namespace gyre::transport

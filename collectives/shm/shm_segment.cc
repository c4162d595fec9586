// ShmSegment: a POSIX shared-memory segment, created exclusively, mapped,
// unlinked by its creator once every rank has mapped it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "gyre/collectives/shm.h"
#include "gyre/error.h"

namespace gyre::collectives {

namespace {

[[noreturn]] void fail(const char* what, const std::string& name, int err) {
  throw TransportError(fmt::format("shared memory segment {}: {} failed: {}", name, what,
                                   std::strerror(err)));
}

void* map(int fd, const std::string& name, std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("mmap", name, errno);
  return p;
}

}  // namespace

ShmSegment ShmSegment::create(const std::string& name, std::size_t bytes) {
  // O_EXCL: a name that exists belongs to someone else; 0600: only this
  // user's processes (the job's ranks) may map it.
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail("shm_open(O_CREAT|O_EXCL)", name, errno);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    fail("ftruncate", name, err);
  }
  // The pages now, so that a segment larger than the room left in
  // /dev/shm fails here (ENOSPC) rather than with SIGBUS at its first
  // write in some collective.
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    fail("posix_fallocate", name, err);
  }
  void* p = nullptr;
  try {
    p = map(fd, name, bytes);
  } catch (...) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw;
  }
  ::close(fd);  // the mapping keeps the memory
  return ShmSegment(name, p, bytes, true);
}

ShmSegment ShmSegment::open(const std::string& name, std::size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) fail("shm_open", name, errno);
  struct stat st{};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes) {
    ::close(fd);
    throw TransportError(fmt::format("shared memory segment {}: has {} bytes, expected {}", name,
                                     static_cast<long long>(st.st_size), bytes));
  }
  void* p = nullptr;
  try {
    p = map(fd, name, bytes);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return ShmSegment(name, p, bytes, false);
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept
    : name_(std::move(o.name_)), data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)), owner_(std::exchange(o.owner_, false)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    this->~ShmSegment();
    new (this) ShmSegment(std::move(o));
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (data_) ::munmap(data_, size_);
}

void ShmSegment::unlink() {
  if (owner_) {
    ::shm_unlink(name_.c_str());
    owner_ = false;
  }
}

}  // namespace gyre::collectives

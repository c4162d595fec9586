// The PMI-1 server of gyre/bootstrap.h: one native thread, poll() over the
// listening socket and one connection per process, line-oriented requests
// ("cmd=NAME key=value ...\n") answered in the order they arrive. The only
// request that waits is barrier_in: answered (barrier_out) to every process
// at once when the last one enters.
#include "gyre/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/error.h"

namespace gyre {

namespace {

// What the server tells clients (PMI-1's limits; MPICH's client lines are
// at most 1024 characters, values included).
constexpr int kKvsNameMax = 256;
constexpr int kKeyMax = 256;
constexpr int kValueMax = 1024;
constexpr const char* kKvsName = "gyre_kvs_0";

std::map<std::string, std::string> parse_line(const std::string& line) {
  std::map<std::string, std::string> kv;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    std::size_t end = line.find(' ', i);
    if (end == std::string::npos) end = line.size();
    const std::string token = line.substr(i, end - i);
    const std::size_t eq = token.find('=');
    if (eq != std::string::npos) kv[token.substr(0, eq)] = token.substr(eq + 1);
    i = end;
  }
  return kv;
}

}  // namespace

struct PmiServer::Impl {
  struct Client {
    int fd = -1;
    int rank = -1;          // from initack; -1 until then
    std::string in;         // bytes received, not yet a whole line
    bool in_barrier = false;
    bool finalized = false;
  };

  int size = 0;
  int port = 0;
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // a pipe: the destructor wakes poll()
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<int> finalize_timeout_ms{30000};
  std::chrono::steady_clock::time_point startup_deadline;  // for the first barrier
  bool first_barrier_done = false;

  mutable std::mutex mu;  // guards error, connected, finalized
  mutable std::condition_variable changed;
  std::string error;
  std::set<int> connected;  // ranks that sent initack
  std::set<int> finalized;  // ranks that sent finalize

  // Owned by the thread alone.
  std::vector<Client> clients;
  std::map<std::string, std::string> kvs;
  int in_barrier = 0;

  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) error = what;
    changed.notify_all();
  }

  static void send_line(Client& c, const std::string& line) {
    const std::string out = line + "\n";
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::send(c.fd, out.data() + done, out.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // the peer is gone; its close is seen by poll()
      done += static_cast<std::size_t>(n);
    }
  }

  void handle(Client& c, const std::string& line) {
    auto kv = parse_line(line);
    const std::string cmd = kv["cmd"];
    if (cmd == "initack") {
      char* end = nullptr;
      const long id = std::strtol(kv["pmiid"].c_str(), &end, 10);
      bool taken;
      {
        std::lock_guard<std::mutex> lock(mu);
        taken = connected.count(static_cast<int>(id)) > 0;
      }
      if (end == kv["pmiid"].c_str() || id < 0 || id >= size || taken) {
        fail(fmt::format("PMI server: a process connected with PMI_ID={} ({}; the job has {} "
                         "processes, ranks 0..{})", kv["pmiid"],
                         taken ? "given twice" : "out of range", size, size - 1));
        send_line(c, "cmd=initack rc=-1");
        return;
      }
      c.rank = static_cast<int>(id);
      {
        std::lock_guard<std::mutex> lock(mu);
        connected.insert(c.rank);
      }
      send_line(c, "cmd=initack");
      send_line(c, fmt::format("cmd=set size={}", size));
      send_line(c, fmt::format("cmd=set rank={}", c.rank));
      send_line(c, "cmd=set debug=0");
    } else if (cmd == "init") {
      send_line(c, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0");
    } else if (cmd == "get_maxes") {
      send_line(c, fmt::format("cmd=maxes kvsname_max={} keylen_max={} vallen_max={} rc=0",
                               kKvsNameMax, kKeyMax, kValueMax));
    } else if (cmd == "get_appnum") {
      send_line(c, "cmd=appnum appnum=0 rc=0");
    } else if (cmd == "get_universe_size") {
      send_line(c, fmt::format("cmd=universe_size size={} rc=0", size));
    } else if (cmd == "get_my_kvsname") {
      send_line(c, fmt::format("cmd=my_kvsname kvsname={} rc=0", kKvsName));
    } else if (cmd == "put") {
      kvs[kv["key"]] = kv["value"];
      send_line(c, "cmd=put_result rc=0");
    } else if (cmd == "get") {
      auto it = kvs.find(kv["key"]);
      if (it == kvs.end()) {
        send_line(c, "cmd=get_result rc=-1 found=FALSE msg=key_not_found");
      } else {
        send_line(c, fmt::format("cmd=get_result rc=0 found=TRUE value={}", it->second));
      }
    } else if (cmd == "barrier_in") {
      if (!c.in_barrier) {
        c.in_barrier = true;
        ++in_barrier;
      }
      if (in_barrier == size) {
        first_barrier_done = true;
        for (Client& o : clients) {
          if (o.in_barrier) {
            o.in_barrier = false;
            send_line(o, "cmd=barrier_out rc=0");
          }
        }
        in_barrier = 0;
      }
    } else if (cmd == "finalize") {
      c.finalized = true;
      send_line(c, "cmd=finalize_ack rc=0");
      std::lock_guard<std::mutex> lock(mu);
      finalized.insert(c.rank);
      changed.notify_all();
    } else if (cmd == "abort") {
      fail(fmt::format("PMI server: rank {} aborted the job (exit code {}): {}", c.rank,
                       kv.count("exitcode") ? kv["exitcode"] : "1", kv["message"]));
    } else {
      // spawn, publish_name, lookup_name...: not for a world made this way.
      send_line(c, fmt::format("cmd={}_result rc=-1 msg=not_supported_by_gyre_pmi_server",
                               cmd.empty() ? "unknown" : cmd));
    }
  }

  // Not every process came within the start-up deadline: the ones waiting
  // in MPI_Init's barrier get an error (their MPI_Init fails instead of
  // waiting for ever), and the error names the missing ranks.
  void startup_timed_out() {
    first_barrier_done = true;  // once
    std::set<int> missing;
    for (int r = 0; r < size; ++r) missing.insert(r);
    for (const Client& c : clients) {
      if (c.in_barrier) missing.erase(c.rank);
    }
    const std::string what = fmt::format(
        "PMI server: {} of {} processes did not reach MPI_Init's barrier within the start-up "
        "timeout (missing ranks: {}); the others' MPI_Init fails",
        missing.size(), size, fmt::join(missing, ", "));
    std::fprintf(stderr, "gyre: %s\n", what.c_str());
    fail(what);
    for (Client& o : clients) {
      if (o.in_barrier) {
        o.in_barrier = false;
        send_line(o, "cmd=barrier_out rc=-1 msg=gyre_start_up_timeout");
      }
    }
    in_barrier = 0;
  }

  void drop(std::size_t i) {
    Client& c = clients[i];
    if (c.in_barrier) --in_barrier;
    if (c.rank >= 0 && !c.finalized) {
      fail(fmt::format("PMI server: rank {} closed its connection before MPI_Finalize (the "
                       "process ended or was killed)", c.rank));
    }
    ::close(c.fd);
    clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void run() {
    std::vector<pollfd> fds;
    char buf[4096];
    while (!stop.load()) {
      fds.clear();
      fds.push_back({wake[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (const Client& c : clients) fds.push_back({c.fd, POLLIN, 0});
      int wait_ms = -1;
      if (!first_barrier_done) {
        const auto left = startup_deadline - std::chrono::steady_clock::now();
        wait_ms = static_cast<int>(std::max<std::int64_t>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(left).count()));
      }
      const int n = ::poll(fds.data(), fds.size(), wait_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail(fmt::format("PMI server: poll: {}", std::strerror(errno)));
        return;
      }
      if (n == 0 && !first_barrier_done) {
        startup_timed_out();
        continue;
      }
      if (fds[0].revents) return;
      if (fds[1].revents & POLLIN) {
        const int fd = ::accept(listen_fd, nullptr, nullptr);
        if (fd >= 0) {
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          Client c;
          c.fd = fd;
          clients.push_back(std::move(c));
        }
      }
      // Clients in the order polled; a dropped one shifts the rest.
      for (std::size_t p = fds.size(); p-- > 2;) {
        if (!fds[p].revents) continue;
        const std::size_t i = p - 2;
        const ssize_t got = ::recv(clients[i].fd, buf, sizeof buf, 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got <= 0) {
          drop(i);
          continue;
        }
        clients[i].in.append(buf, static_cast<std::size_t>(got));
        std::size_t nl;
        while ((nl = clients[i].in.find('\n')) != std::string::npos) {
          std::string line = clients[i].in.substr(0, nl);
          clients[i].in.erase(0, nl + 1);
          handle(clients[i], line);
        }
      }
    }
  }
};

PmiServer::PmiServer(int size, const std::string& bind_address, int port,
                     std::chrono::milliseconds startup_timeout)
    : impl_(std::make_unique<Impl>()) {
  if (size < 1) throw InvalidArgument(fmt::format("PmiServer: size {} (at least 1)", size));
  impl_->size = size;
  impl_->startup_deadline = std::chrono::steady_clock::now() + startup_timeout;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, bind_address.c_str(), &addr.sin_addr) != 1) {
    throw InvalidArgument(
        fmt::format("PmiServer: '{}' is not an IPv4 address to listen on", bind_address));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw TransportError(fmt::format("PmiServer: socket: {}", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(fd, size + 16) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw TransportError(
        fmt::format("PmiServer: cannot listen on {}:{}: {}", bind_address, port, why));
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  impl_->port = ntohs(addr.sin_port);
  impl_->listen_fd = fd;
  if (::pipe2(impl_->wake, O_CLOEXEC) != 0) {
    ::close(fd);
    throw TransportError(fmt::format("PmiServer: pipe: {}", std::strerror(errno)));
  }
  Impl* raw = impl_.get();
  impl_->thread = std::thread([raw] { raw->run(); });
}

PmiServer::~PmiServer() {
  wait_finalized(std::chrono::milliseconds(impl_->finalize_timeout_ms.load()));
  impl_->stop = true;
  const char b = 0;
  (void)!::write(impl_->wake[1], &b, 1);
  if (impl_->thread.joinable()) impl_->thread.join();
  for (auto& c : impl_->clients) ::close(c.fd);
  ::close(impl_->listen_fd);
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

int PmiServer::port() const { return impl_->port; }
int PmiServer::size() const { return impl_->size; }

bool PmiServer::wait_finalized(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->changed.wait_for(lock, timeout, [&] {
    return !impl_->error.empty() || impl_->finalized.size() == impl_->connected.size();
  }) && impl_->error.empty();
}

void PmiServer::set_finalize_timeout(std::chrono::milliseconds timeout) {
  impl_->finalize_timeout_ms = static_cast<int>(timeout.count());
}

std::string PmiServer::error() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->error;
}

}  // namespace gyre

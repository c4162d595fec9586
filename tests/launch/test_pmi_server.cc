// The PMI-1 server of gyre/bootstrap.h, driven by clients that speak the
// wire protocol as MPICH's PMI-1 client does (initack, then init, maxes,
// kvsname, put/get, barrier, finalize), each on a thread of its own: the
// exchange MPI_Init makes, a barrier that waits for every process, refusals
// (a PMI_ID out of range or given twice, spawn), the start-up timeout that
// fails the waiting processes naming the missing ones, and a process that
// disconnects before finalize.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gyre/bootstrap.h"
#include "gyre/error.h"

using namespace std::chrono_literals;

namespace {

// One process's side of the protocol.
class Client {
 public:
  explicit Client(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~Client() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void send(const std::string& line) {
    const std::string out = line + "\n";
    REQUIRE(::send(fd_, out.data(), out.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(out.size()));
  }
  // The next line's key=value pairs ({} when the connection closed).
  std::map<std::string, std::string> receive() {
    std::string line;
    char c;
    while (::recv(fd_, &c, 1, 0) == 1) {
      if (c == '\n') break;
      line += c;
    }
    std::map<std::string, std::string> kv;
    std::size_t i = 0;
    while (i < line.size()) {
      std::size_t end = line.find(' ', i);
      if (end == std::string::npos) end = line.size();
      const std::string token = line.substr(i, end - i);
      const std::size_t eq = token.find('=');
      if (eq != std::string::npos) kv[token.substr(0, eq)] = token.substr(eq + 1);
      i = end + 1;
    }
    return kv;
  }
  std::map<std::string, std::string> ask(const std::string& line) {
    send(line);
    return receive();
  }
  // PMII_Set_from_port's handshake; returns (rank, size).
  std::pair<int, int> handshake(int id) {
    auto ack = ask("cmd=initack pmiid=" + std::to_string(id));
    if (ack["cmd"] != "initack" || ack.count("rc")) return {-1, -1};
    auto size = receive(), rank = receive(), debug = receive();
    CHECK(size["cmd"] == "set");
    CHECK(debug["debug"] == "0");
    return {std::stoi(rank["rank"]), std::stoi(size["size"])};
  }

 private:
  int fd_ = -1;
};

}  // namespace

TEST_CASE("PMI server: the exchange of MPI_Init among 4 processes, then finalize") {
  constexpr int kSize = 4;
  gyre::PmiServer server(kSize, "127.0.0.1");
  REQUIRE(server.port() > 0);
  std::vector<std::thread> procs;
  std::vector<std::string> seen(kSize);
  for (int id = 0; id < kSize; ++id) {
    procs.emplace_back([&, id] {
      Client c(server.port());
      auto [rank, size] = c.handshake(id);
      CHECK(rank == id);
      CHECK(size == kSize);
      CHECK(c.ask("cmd=init pmi_version=1 pmi_subversion=1")["cmd"] == "response_to_init");
      auto maxes = c.ask("cmd=get_maxes");
      CHECK(std::stoi(maxes["vallen_max"]) >= 256);
      const std::string kvs = c.ask("cmd=get_my_kvsname")["kvsname"];
      CHECK(!kvs.empty());
      CHECK(c.ask("cmd=get_appnum")["appnum"] == "0");
      CHECK(c.ask("cmd=get_universe_size")["size"] == std::to_string(kSize));
      CHECK(c.ask("cmd=put kvsname=" + kvs + " key=card" + std::to_string(id) +
                  " value=addr-of-" + std::to_string(id))["rc"] == "0");
      // Nobody passes the barrier before everyone has put its card.
      CHECK(c.ask("cmd=barrier_in")["cmd"] == "barrier_out");
      const int peer = (id + 1) % kSize;
      auto got = c.ask("cmd=get kvsname=" + kvs + " key=card" + std::to_string(peer));
      CHECK(got["rc"] == "0");
      seen[static_cast<std::size_t>(id)] = got["value"];
      auto missing = c.ask("cmd=get kvsname=" + kvs + " key=nothing");
      CHECK(missing["rc"] != "0");
      CHECK(c.ask("cmd=spawn totspawns=1")["rc"] != "0");  // not for this world
      CHECK(c.ask("cmd=barrier_in")["cmd"] == "barrier_out");  // a second round
      CHECK(c.ask("cmd=finalize")["cmd"] == "finalize_ack");
    });
  }
  for (auto& t : procs) t.join();
  for (int id = 0; id < kSize; ++id) {
    CHECK(seen[static_cast<std::size_t>(id)] == "addr-of-" + std::to_string((id + 1) % kSize));
  }
  CHECK(server.wait_finalized(5s));
  CHECK(server.error().empty());
}

TEST_CASE("PMI server: a PMI_ID out of range or given twice is refused and named") {
  gyre::PmiServer server(2, "127.0.0.1");
  {
    Client c(server.port());
    CHECK(c.handshake(2).first == -1);
  }
  CHECK_THAT(server.error(), Catch::Contains("PMI_ID=2") && Catch::Contains("out of range"));
  gyre::PmiServer again(2, "127.0.0.1");
  Client a(again.port()), b(again.port());
  CHECK(a.handshake(1).first == 1);
  CHECK(b.handshake(1).first == -1);
  CHECK_THAT(again.error(), Catch::Contains("given twice"));
  a.ask("cmd=finalize");
  again.set_finalize_timeout(0ms);
}

TEST_CASE("PMI server: processes missing at start-up fail the others' barrier, named") {
  gyre::PmiServer server(3, "127.0.0.1", 0, 300ms);
  Client c(server.port());
  c.handshake(0);
  const auto start = std::chrono::steady_clock::now();
  auto out = c.ask("cmd=barrier_in");  // ranks 1 and 2 never come
  CHECK(out["cmd"] == "barrier_out");
  CHECK(out["rc"] != "0");
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK_THAT(server.error(), Catch::Contains("missing ranks: 1, 2"));
  server.set_finalize_timeout(0ms);
}

TEST_CASE("PMI server: a process that closes before finalize is named") {
  gyre::PmiServer server(2, "127.0.0.1");
  {
    Client c(server.port());
    c.handshake(1);
  }  // closed: the process ended without MPI_Finalize
  CHECK_FALSE(server.wait_finalized(10s));
  CHECK_THAT(server.error(), Catch::Contains("rank 1 closed its connection"));
}

TEST_CASE("PMI server: bad arguments") {
  CHECK_THROWS_AS(gyre::PmiServer(0), gyre::InvalidArgument);
  CHECK_THROWS_AS(gyre::PmiServer(2, "not-an-address"), gyre::InvalidArgument);
}

// Growing the world back after a rebuild (MpiWorld::grow, on the
// survivors) and joining it (MpiWorld::join_survivors, on a replacement
// started by them): MPI_Comm_spawn_multiple, MPI_Intercomm_merge, and the
// few words the replacements must be told (docs/elastic.md, "Growing back").
//
// Threads: grow() runs under gyre's API lock inside rebuild(), with no
// transport in use; join_survivors() runs in MpiWorld's constructor.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/mpi_transport.h"
#include "gyre/error.h"
#include "mpi_comm.h"

extern char** environ;

namespace gyre::transport {

namespace {

using detail::check_mpi;

// The header the new rank 0 broadcasts to the merged world right after the
// merge, then the environment block of kHeaderEnvBytes bytes.
enum HeaderWord { kStep, kRoot, kSurvivors, kRebuilds, kStartSize, kEnvBytes, kHeaderWords };

std::mutex g_command_mu;  // guards g_command
std::vector<std::string> g_command;

// This process's command line, as exec() got it.
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> argv;
  std::size_t start = 0;
  while (start < all.size()) {
    const std::size_t end = all.find('\0', start);
    argv.push_back(all.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return argv;
}

std::vector<std::string> spawn_command() {
  std::lock_guard<std::mutex> lock(g_command_mu);
  return g_command.empty() ? own_command_line() : g_command;
}

// Every GYRE_* variable of this process, as "NAME=value\0" entries: the
// replacements run with the same options (MPI does not pass mpirun's -x
// variables to spawned processes).
std::string gyre_environment() {
  std::string block;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "GYRE_", 5) == 0) {
      block += *e;
      block.push_back('\0');
    }
  }
  return block;
}

// A host and how many replacements to start there.
struct Placement {
  std::string host;
  int count = 0;
};

// Runs the discovery script and parses its `host:slots` lines (blank lines
// and lines starting with '#' skipped). Throws InvalidArgument naming the
// script and the line that does not parse, or the script's failure.
std::vector<Placement> discover_hosts(const std::string& script) {
  FILE* p = ::popen(script.c_str(), "r");
  if (p == nullptr) {
    throw InvalidArgument(fmt::format("host discovery script '{}' could not be run: {}", script,
                                      std::strerror(errno)));
  }
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  if (status != 0) {
    throw InvalidArgument(
        fmt::format("host discovery script '{}' failed (exit status {})", script, status));
  }
  std::vector<Placement> hosts;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const std::size_t colon = line.rfind(':');
    int slots = -1;
    if (colon != std::string::npos && colon > 0 && colon + 1 < line.size()) {
      try {
        std::size_t used = 0;
        slots = std::stoi(line.substr(colon + 1), &used);
        if (used != line.size() - colon - 1) slots = -1;
      } catch (const std::exception&) {
        slots = -1;
      }
    }
    if (slots < 0) {
      throw InvalidArgument(fmt::format(
          "host discovery script '{}' printed '{}', expected host:slots", script, line));
    }
    hosts.push_back({line.substr(0, colon), slots});
  }
  return hosts;
}

// Where `needed` replacements go. With a script: its hosts in order, each
// up to its slots minus the ranks already there. Without: the hosts of
// the lost ranks (one each, again from the first if more are needed).
std::vector<Placement> place(int needed, const std::string& script,
                             const std::vector<std::string>& current_hosts,
                             const std::vector<std::string>& lost_hosts) {
  std::vector<Placement> plan;
  auto add = [&](const std::string& host, int count) {
    if (count <= 0) return;
    if (!plan.empty() && plan.back().host == host) {
      plan.back().count += count;
    } else {
      plan.push_back({host, count});
    }
  };
  if (script.empty()) {
    for (int i = 0; i < needed; ++i) {
      add(lost_hosts.empty() ? std::string() : lost_hosts[static_cast<std::size_t>(i) %
                                                          lost_hosts.size()],
          1);
    }
    return plan;
  }
  int left = needed;
  for (const Placement& h : discover_hosts(script)) {
    if (left == 0) break;
    int used = 0;
    for (const std::string& c : current_hosts) used += c == h.host ? 1 : 0;
    const int n = std::min(left, h.count - used);
    add(h.host, n);
    left -= std::max(n, 0);
  }
  return plan;
}

}  // namespace

void MpiWorld::set_spawn_command(std::vector<std::string> argv) {
  std::lock_guard<std::mutex> lock(g_command_mu);
  g_command = std::move(argv);
}

GrowOutcome MpiWorld::grow(const GrowRequest& request) {
  GrowOutcome out;
  MPI_Comm comm = detail::world_comm();
  const int needed = request.target_size - size_;
  // The plan is the new rank 0's; the others learn how many it starts.
  std::vector<Placement> plan;
  int planned = 0;
  if (rank_ == 0 && needed > 0) {
    try {
      plan = place(needed, request.discovery_script, hosts_, lost_hosts_);
    } catch (const InvalidArgument& e) {
      out.problem = e.what();
    }
    for (const Placement& p : plan) planned += p.count;
    if (planned < needed && out.problem.empty()) {
      out.problem = fmt::format(
          "the host discovery script '{}' lists free slots for {} of the {} replacements",
          request.discovery_script, planned, needed);
    }
  }
  int rc = MPI_Bcast(&planned, 1, MPI_INT, 0, comm);
  if (rc != MPI_SUCCESS) {
    if (detail::process_failure(rc, comm)) {
      throw RankFailedError("MpiWorld::grow: a rank failed before the spawn: " +
                            detail::mpi_error_string(rc));
    }
    check_mpi(rc, "MPI_Bcast (grow)");
  }
  if (planned == 0) return out;

  // Only the root's arguments count; the others pass one dummy command.
  const std::vector<std::string> argv = spawn_command();
  if (argv.empty()) throw TransportError("MpiWorld::grow: no command line to spawn");
  std::vector<char*> args;  // argv[1..], null-terminated (the same for every host)
  for (std::size_t i = 1; i < argv.size(); ++i) args.push_back(const_cast<char*>(argv[i].c_str()));
  args.push_back(nullptr);
  char cwd[4096] = {};
  const bool have_cwd = ::getcwd(cwd, sizeof cwd) != nullptr;
  const std::size_t entries = rank_ == 0 ? plan.size() : 1;
  std::vector<char*> commands(entries, const_cast<char*>(argv[0].c_str()));
  std::vector<char**> argvs(entries, args.data());
  std::vector<int> counts(entries, 1);
  std::vector<MPI_Info> infos(entries, MPI_INFO_NULL);
  for (std::size_t i = 0; rank_ == 0 && i < plan.size(); ++i) {
    counts[i] = plan[i].count;
    MPI_Info_create(&infos[i]);
    if (!plan[i].host.empty()) MPI_Info_set(infos[i], "host", plan[i].host.c_str());
    if (have_cwd) MPI_Info_set(infos[i], "wdir", cwd);
    for (int k = 0; k < plan[i].count; ++k) out.hosts.push_back(plan[i].host);
  }
  MPI_Comm inter = MPI_COMM_NULL;
  rc = MPI_Comm_spawn_multiple(static_cast<int>(entries), commands.data(), argvs.data(),
                               counts.data(), infos.data(), 0, comm, &inter,
                               MPI_ERRCODES_IGNORE);
  for (MPI_Info& info : infos) {
    if (info != MPI_INFO_NULL) MPI_Info_free(&info);
  }
  if (rc != MPI_SUCCESS) {
    if (detail::process_failure(rc, comm)) {
      throw RankFailedError("MpiWorld::grow: a rank failed during MPI_Comm_spawn: " +
                            detail::mpi_error_string(rc));
    }
    // MPI refused (no room on the hosts, a program it cannot start): the
    // world stays as it is.
    if (rank_ == 0) {
      out.problem = "MPI_Comm_spawn_multiple failed: " + detail::mpi_error_string(rc);
    }
    out.hosts.clear();
    return out;
  }
  check_mpi(MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  MPI_Comm merged = MPI_COMM_NULL;
  // high = 0 here, 1 on the replacements: survivors keep their ranks.
  rc = MPI_Intercomm_merge(inter, 0, &merged);
  if (rc != MPI_SUCCESS) {
    if (detail::process_failure(rc, inter)) {
      throw RankFailedError("MpiWorld::grow: a rank failed while the replacements joined: " +
                            detail::mpi_error_string(rc));
    }
    check_mpi(rc, "MPI_Intercomm_merge");
  }
  check_mpi(MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int remote = 0;
  MPI_Comm_remote_size(inter, &remote);
  out.spawned = remote;

  const std::string env = gyre_environment();
  std::uint64_t header[kHeaderWords] = {};
  header[kStep] = request.step;
  header[kRoot] = static_cast<std::uint64_t>(request.root);
  header[kSurvivors] = static_cast<std::uint64_t>(size_);
  header[kRebuilds] = static_cast<std::uint64_t>(rebuilds_);
  header[kStartSize] = static_cast<std::uint64_t>(start_size_);
  header[kEnvBytes] = env.size();
  std::vector<char> env_block(env.begin(), env.end());
  // Only rank 0's header and environment are sent; the others take part
  // in the broadcasts with buffers of the same sizes.
  rc = MPI_Bcast(header, kHeaderWords, MPI_UINT64_T, 0, merged);
  if (rc == MPI_SUCCESS) {
    env_block.resize(header[kEnvBytes]);
    rc = MPI_Bcast(env_block.data(), static_cast<int>(env_block.size()), MPI_CHAR, 0, merged);
  }
  if (rc != MPI_SUCCESS) {
    if (detail::process_failure(rc, merged)) {
      throw RankFailedError("MpiWorld::grow: a rank failed while the replacements joined: " +
                            detail::mpi_error_string(rc));
    }
    check_mpi(rc, "MPI_Bcast (join)");
  }
  // The communicators before are not freed (the old world holds dead ranks).
  detail::world_comm() = merged;
  derive_layout();
  return out;
}

void MpiWorld::join_survivors(void* parent_ptr) {
  MPI_Comm parent = *static_cast<MPI_Comm*>(parent_ptr);
  check_mpi(MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  MPI_Comm merged = MPI_COMM_NULL;
  check_mpi(MPI_Intercomm_merge(parent, 1, &merged), "MPI_Intercomm_merge (joining the survivors)");
  check_mpi(MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  std::uint64_t header[kHeaderWords] = {};
  check_mpi(MPI_Bcast(header, kHeaderWords, MPI_UINT64_T, 0, merged), "MPI_Bcast (join)");
  std::vector<char> env(header[kEnvBytes]);
  check_mpi(MPI_Bcast(env.data(), static_cast<int>(env.size()), MPI_CHAR, 0, merged),
            "MPI_Bcast (join)");
  // The survivors' options, before gyre reads them (Options::from_env).
  for (std::size_t at = 0; at < env.size();) {
    const std::size_t end = std::find(env.begin() + static_cast<long>(at), env.end(), '\0') -
                            env.begin();
    const std::string entry(env.data() + at, end - at);
    const std::size_t eq = entry.find('=');
    if (eq != std::string::npos) {
      ::setenv(entry.substr(0, eq).c_str(), entry.substr(eq + 1).c_str(), 1);
    }
    at = end + 1;
  }
  join_.replacement = true;
  join_.step = header[kStep];
  join_.root = static_cast<int>(header[kRoot]);
  join_.survivors = static_cast<int>(header[kSurvivors]);
  join_.rebuilds = static_cast<int>(header[kRebuilds]);
  rebuilds_ = join_.rebuilds;
  start_size_ = static_cast<int>(header[kStartSize]);
  // The job had a failure: MPI_Finalize may wait for the dead (finalize()).
  rebuilt_ = true;
  detail::world_comm() = merged;
}

}  // namespace gyre::transport

// Writes the seed corpus of the fuzz targets from real encoded messages:
//   corpus/message/<name>     one encoded RoundMessage per file
//   corpus/coordinator/<name> rounds of three ranks' messages, concatenated
//                             (message i is rank i % 3's in round i / 3)
// Run by make_corpus.sh; the files are checked in, so rerun it only when
// the wire format or the scenarios change.
#include <cstdio>
#include <filesystem>
#include <map>
#include <fstream>
#include <string>
#include <vector>

#include "negotiation/message.h"

using namespace gyre;
using namespace gyre::core;

namespace {

using Round = std::vector<RoundMessage>;  // one message per rank

Request req(const std::string& name, Collective c, std::vector<std::int64_t> shape,
            std::uint64_t seq = 1, DataType dt = DataType::kFloat32, ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.name = name;
  r.collective = c;
  r.shape = std::move(shape);
  r.seq = seq;
  r.dtype = dt;
  r.op = op;
  return r;
}

RoundMessage msg(std::vector<Request> requests, std::uint64_t step = 0) {
  RoundMessage m;
  m.step = step;
  m.requests = std::move(requests);
  return m;
}

RoundMessage hits(std::vector<std::uint32_t> slots, std::uint64_t step = 0) {
  RoundMessage m;
  m.step = step;
  m.cache_hits = std::move(slots);
  return m;
}

std::vector<std::byte> concat(const std::vector<Round>& rounds) {
  std::vector<std::byte> out;
  for (const Round& r : rounds) {
    for (const RoundMessage& m : r) {
      auto b = encode(m);
      out.insert(out.end(), b.begin(), b.end());
    }
  }
  return out;
}

void write(const std::filesystem::path& p, const std::vector<std::byte>& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::map<std::string, std::vector<Round>> scenarios() {
  std::map<std::string, std::vector<Round>> s;
  // A training loop: full requests, then cache hits, an allgather whose
  // first dimension differs between ranks, then a shutdown.
  {
    auto step1 = [](int r) {
      return msg({req("grad.0", Collective::kAllreduce, {4, 3}, 1, DataType::kFloat32,
                      ReduceOp::kAverage),
                  req("grad.1", Collective::kAllreduce, {100}, 1, DataType::kFloat16),
                  req("gather", Collective::kAllgather, {1 + r, 3}, 1, DataType::kInt32)});
    };
    auto step2 = [](int r) {
      RoundMessage m = hits({0, 1}, 1);
      m.requests.push_back(req("gather", Collective::kAllgather, {3 - r, 3}, 2, DataType::kInt32));
      return m;
    };
    RoundMessage bye;
    bye.shutdown = true;
    s["training"] = {{step1(0), step1(1), step1(2)},
                     {step2(0), step2(1), step2(2)},
                     {hits({0, 1}, 2), hits({0, 1}, 2), bye}};
  }
  // Ranks disagree: shape, dtype, iteration of a reused name.
  s["mismatch"] = {{msg({req("w", Collective::kAllreduce, {4, 5})}),
                    msg({req("w", Collective::kAllreduce, {4, 6})}),
                    msg({req("w", Collective::kAllreduce, {4, 5}, 2)})},
                   {msg({req("d", Collective::kAllreduce, {8}, 1, DataType::kInt64)}),
                    msg({req("d", Collective::kAllreduce, {8}, 1, DataType::kInt8)}),
                    msg({[] {
                      Request b = req("d", Collective::kBroadcast, {8});
                      b.root = 0;
                      return b;
                    }()})}};
  // A refusal announced by one rank; the others' valid requests.
  {
    Request bad = req("x", Collective::kAllreduce, {1});
    bad.error_kind = ErrorKind::kInvalidArgument;
    bad.error = "allreduce 'x': input buffer is null";
    s["refusal"] = {{msg({req("x", Collective::kAllreduce, {2})}), msg({bad}),
                     msg({req("x", Collective::kAllreduce, {2})})},
                    {msg({req("x", Collective::kAllreduce, {2}, 2)}),
                     msg({req("x", Collective::kAllreduce, {2}, 2)}),
                     msg({req("x", Collective::kAllreduce, {2}, 2)})}};
  }
  // join: rank 1 has joined while the others reduce; then every rank joins.
  {
    RoundMessage joined;
    joined.joined = true;
    s["join"] = {{msg({req("j", Collective::kAllreduce, {5})}), joined,
                  msg({req("j", Collective::kAllreduce, {5})})},
                 {msg({req("m", Collective::kAllreduce, {5}, 1, DataType::kFloat32, ReduceOp::kMax)}),
                  joined, msg({req("m", Collective::kAllreduce, {5}, 1, DataType::kFloat32,
                                   ReduceOp::kMax)})},
                 {joined, joined, joined}};
  }
  // Every other collective, with the fields that only they use.
  {
    auto all = [](int r) {
      Request b = req("bcast", Collective::kBroadcast, {8});
      b.root = 2;
      Request a2a = req("a2a", Collective::kAlltoall, {6, 2});
      a2a.splits = {1 + r % 2, 2, 3 - r % 2};
      Request rs = req("rs", Collective::kReducescatter, {9}, 1, DataType::kBFloat16);
      Request fp = req("__gyre.fingerprint.0", Collective::kFingerprint, {});
      fp.digests = {11, 22, static_cast<std::uint64_t>(33 + (r == 2))};
      Request rsync = req("__gyre.resync.0", Collective::kResync, {});
      rsync.digests = {44};
      rsync.resync_policy = ResyncPolicy::kAverage;
      Request bar = req("__gyre.barrier.0", Collective::kBarrier, {});
      return msg({b, a2a, rs, fp, rsync, bar}, static_cast<std::uint64_t>(r));
    };
    s["collectives"] = {{all(0), all(1), all(2)}};
  }
  // A grouped allreduce whose members arrive in different rounds.
  {
    auto member = [](const std::string& name) {
      Request g = req(name, Collective::kAllreduce, {3});
      g.group = "g.0";
      g.group_size = 2;
      return g;
    };
    s["group"] = {{msg({member("g.0")}), msg({member("g.0"), member("g.1")}), msg({member("g.1")})},
                  {msg({member("g.1")}), msg({}), msg({member("g.0")})}};
  }
  // Rank 0's stall inspector fails a tensor rank 2 never sent.
  {
    RoundMessage stall = msg({});
    stall.stall_failures = {"stuck"};
    s["stall"] = {{msg({req("stuck", Collective::kAllreduce, {2})}),
                   msg({req("stuck", Collective::kAllreduce, {2})}), msg({})},
                  {stall, msg({}), msg({})}};
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus OUT_DIR\n");
    return 2;
  }
  const std::filesystem::path out = argv[1];
  std::filesystem::create_directories(out / "message");
  std::filesystem::create_directories(out / "coordinator");
  int files = 0;
  for (const auto& [name, rounds] : scenarios()) {
    write(out / "coordinator" / name, concat(rounds));
    ++files;
    for (std::size_t i = 0; i < rounds.size(); ++i) {
      for (std::size_t r = 0; r < rounds[i].size(); ++r) {
        write(out / "message" / (name + "-round" + std::to_string(i) + "-rank" + std::to_string(r)),
              encode(rounds[i][r]));
        ++files;
      }
    }
  }
  std::printf("make_corpus: %d files in %s\n", files, out.c_str());
  return 0;
}

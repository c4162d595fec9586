// The parameter store's pure parts: where tensors are placed, and what a
// push does to a shard under each policy (closed forms).
#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <vector>

#include "gyre/error.h"
#include "store/placement.h"
#include "store/shard.h"

using namespace gyre;
using namespace gyre::core::store;

namespace {

template <typename T>
const std::byte* bytes(const std::vector<T>& v) {
  return reinterpret_cast<const std::byte*>(v.data());
}

template <typename T>
std::vector<T> read_all(const Shard& s, std::int64_t* version = nullptr) {
  std::vector<T> out(static_cast<std::size_t>(s.count()));
  const std::int64_t v = s.read(reinterpret_cast<std::byte*>(out.data()));
  if (version) *version = v;
  return out;
}

}  // namespace

TEST_CASE("small tensors go whole to the member holding the fewest bytes") {
  std::vector<std::size_t> held(3, 0);
  auto a = place_tensor(10, 4, 1024, held);  // 40 bytes -> member 0
  auto b = place_tensor(5, 4, 1024, held);   // 20 -> member 1
  auto c = place_tensor(1, 8, 1024, held);   // 8 -> member 2
  auto d = place_tensor(2, 4, 1024, held);   // 8 -> member 2 (holds 8, the fewest)
  REQUIRE(a.size() == 1);
  CHECK(a[0].owner == 0);
  CHECK(a[0].count == 10);
  CHECK(b[0].owner == 1);
  CHECK(c[0].owner == 2);
  CHECK(d[0].owner == 2);
  CHECK(held == std::vector<std::size_t>{40, 20, 16});
}

TEST_CASE("a tensor over the split size is cut into one contiguous shard per member") {
  for (int members : {2, 3, 4, 7}) {
    for (std::int64_t numel : {64, 65, 97, 1000}) {
      std::vector<std::size_t> held(static_cast<std::size_t>(members), 0);
      auto shards = place_tensor(numel, 4, 16, held);
      REQUIRE(shards.size() == static_cast<std::size_t>(members));
      std::int64_t at = 0;
      for (int i = 0; i < members; ++i) {
        CHECK(shards[i].owner == i);
        CHECK(shards[i].offset == at);
        CHECK(shards[i].count >= numel / members);
        CHECK(shards[i].count <= numel / members + 1);
        at += shards[i].count;
      }
      CHECK(at == numel);
      CHECK(std::accumulate(held.begin(), held.end(), std::size_t{0}) ==
            static_cast<std::size_t>(numel) * 4);
    }
  }
}

TEST_CASE("a tensor of no elements is one empty shard") {
  std::vector<std::size_t> held(2, 0);
  auto s = place_tensor(0, 4, 0, held);
  REQUIRE(s.size() == 1);
  CHECK(s[0].count == 0);
}

TEST_CASE("reject: applied while the lag is within the staleness, else the version is returned") {
  const std::vector<float> init{1, 2, 3};
  Shard s(DataType::kFloat32, 3, bytes(init));
  const std::vector<float> d{10, 20, 30};
  auto o = s.push(bytes(d), 0, 0, PushPolicy::kReject);
  CHECK(o.applied);
  CHECK(o.version == 1);
  CHECK(o.lag == 0);
  // Another worker that also read version 0: rejected, told version 1.
  o = s.push(bytes(d), 0, 0, PushPolicy::kReject);
  CHECK_FALSE(o.applied);
  CHECK(o.version == 1);
  CHECK(o.lag == 1);
  std::int64_t v = -1;
  CHECK(read_all<float>(s, &v) == std::vector<float>{11, 22, 33});
  CHECK(v == 1);
  // With staleness 1 the same stale push is applied.
  o = s.push(bytes(d), 0, 1, PushPolicy::kReject);
  CHECK(o.applied);
  CHECK(o.version == 2);
  CHECK(read_all<float>(s) == std::vector<float>{21, 42, 63});
  // Unbounded.
  o = s.push(bytes(d), 0, -1, PushPolicy::kReject);
  CHECK(o.applied);
  CHECK(o.lag == 2);
}

TEST_CASE("scale divides a stale update by 1 + lag; apply takes everything") {
  const std::vector<double> init{0, 0};
  Shard s(DataType::kFloat64, 2, bytes(init));
  const std::vector<double> d{6, 12};
  s.push(bytes(d), 0, 0, PushPolicy::kReject);  // version 1: {6, 12}
  s.push(bytes(d), 1, 0, PushPolicy::kReject);  // version 2: {12, 24}
  auto o = s.push(bytes(d), 0, 2, PushPolicy::kScale);  // lag 2: + {2, 4}
  CHECK(o.applied);
  CHECK(o.lag == 2);
  CHECK(o.factor == Approx(1.0 / 3));
  CHECK(read_all<double>(s) == std::vector<double>{14, 28});
  o = s.push(bytes(d), 0, 2, PushPolicy::kScale);  // lag 3 > 2: rejected
  CHECK_FALSE(o.applied);
  o = s.push(bytes(d), 0, 0, PushPolicy::kApply);  // lag 3, staleness ignored: version 4
  CHECK(o.applied);
  CHECK(o.factor == 1.0);
  CHECK(o.version == 4);
  CHECK(read_all<double>(s) == std::vector<double>{20, 40});
}

TEST_CASE("integer shards add exactly; scale truncates as gyre's scaling does") {
  const std::vector<std::int32_t> init{100, -100};
  Shard s(DataType::kInt32, 2, bytes(init));
  const std::vector<std::int32_t> d{7, -7};
  s.push(bytes(d), 0, 0, PushPolicy::kReject);
  auto o = s.push(bytes(d), 0, 1, PushPolicy::kScale);  // lag 1: + {3, -3}
  CHECK(o.applied);
  CHECK(read_all<std::int32_t>(s) == std::vector<std::int32_t>{110, -110});
}

TEST_CASE("a base version the shard never had is refused, and so is scale on bool") {
  const std::vector<float> init{0};
  Shard s(DataType::kFloat32, 1, bytes(init));
  CHECK_THROWS_AS(s.push(bytes(init), 1, 0, PushPolicy::kReject), InvalidArgument);
  CHECK_THROWS_AS(s.push(bytes(init), -1, 0, PushPolicy::kReject), InvalidArgument);
  std::int64_t v = -1;
  read_all<float>(s, &v);
  CHECK(v == 0);
  const std::vector<std::uint8_t> flags{0, 1};
  Shard b(DataType::kBool, 2, bytes(flags));
  CHECK_THROWS_AS(b.push(bytes(flags), 0, 0, PushPolicy::kScale), InvalidArgument);
}

TEST_CASE("check_push refuses what push refuses, and changes nothing either way") {
  const std::vector<float> init{2, 3}, delta{1, 1};
  Shard s(DataType::kFloat32, 2, bytes(init));
  CHECK_THROWS_WITH(s.check_push(1, PushPolicy::kReject), Catch::Contains("never this shard's"));
  CHECK_THROWS_AS(s.check_push(-1, PushPolicy::kApply), InvalidArgument);
  s.check_push(0, PushPolicy::kScale);  // valid: no throw, no change
  std::int64_t v = -1;
  CHECK(read_all<float>(s, &v) == init);
  CHECK(v == 0);
  CHECK(s.push(bytes(delta), 0, 0, PushPolicy::kReject).applied);
  s.check_push(1, PushPolicy::kReject);  // the version it has now
  CHECK(read_all<float>(s, &v) == std::vector<float>{3, 4});
  CHECK(v == 1);
  const std::vector<std::uint8_t> flags{0, 1};
  Shard b(DataType::kBool, 2, bytes(flags));
  CHECK_THROWS_WITH(b.check_push(0, PushPolicy::kScale), Catch::Contains("'scale'"));
}

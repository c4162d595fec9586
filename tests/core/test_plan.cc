// The planning every backend runs with (execution/plan.h) and the shape
// helpers (gyre/sizes.h): closed-form expectations, no transport.
#include <catch2/catch.hpp>

#include <vector>

#include "execution/plan.h"
#include "gyre/sizes.h"
#include "negotiation/coordinator.h"

using namespace gyre;
using namespace gyre::core;

namespace {

Request request(Collective c, DataType dt, std::vector<std::int64_t> shape) {
  Request q;
  q.name = "t";
  q.collective = c;
  q.dtype = dt;
  q.shape = std::move(shape);
  return q;
}

}  // namespace

TEST_CASE("numel, row_elems and align_up", "[plan]") {
  using V = std::vector<std::int64_t>;
  CHECK(numel(V{}) == 1);  // a scalar
  CHECK(numel(V{0, 5}) == 0);
  CHECK(numel(V{3, 4, 5}) == 60);
  CHECK(row_elems(V{}) == 1);
  CHECK(row_elems(V{7}) == 1);
  CHECK(row_elems(V{7, 4, 5}) == 20);
  CHECK(row_elems(V{0, 4}) == 4);  // no rows, still a row size
  CHECK(align_up(0, 64) == 0);
  CHECK(align_up(1, 64) == 64);
  CHECK(align_up(64, 64) == 64);
  CHECK(align_up(65, 64) == 128);
  CHECK(align_up(5, 1) == 5);
  TensorView v{nullptr, DataType::kFloat16, {2, 3}, {}};
  CHECK(v.numel() == 6);
  CHECK(v.nbytes() == 12);
}

TEST_CASE("average is a sum with 1/contributors in the postscale; other ops as agreed",
          "[plan]") {
  CHECK(effective_reduction(ReduceOp::kAverage, 2.0, 3.0, 4) ==
        Reduction{ReduceOp::kSum, 2.0, 0.75});
  // Joined ranks are not counted: 3 contributors of a world of 4.
  CHECK(effective_reduction(ReduceOp::kAverage, 1.0, 1.0, 3).postscale == Approx(1.0 / 3));
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    CHECK(effective_reduction(op, 0.5, 2.0, 3) == Reduction{op, 0.5, 2.0});
  }
  Response r;
  r.agreed = request(Collective::kAllreduce, DataType::kFloat32, {4});
  r.agreed.op = ReduceOp::kAverage;
  r.agreed.postscale = 2.0;
  r.contributors = 2;
  CHECK(effective_reduction(r) == Reduction{ReduceOp::kSum, 1.0, 1.0});
}

TEST_CASE("allgather: per-rank blocks, joined ranks empty, output rows summed", "[plan]") {
  // Rank 0: 3 rows, rank 1: joined (no request), rank 2: 0 rows, rank 3: 5
  // rows; rows of 2 x 4 float16 elements (16 bytes).
  Response resp;
  resp.collective = Collective::kAllgather;
  const std::vector<std::int64_t> rows = {3, -1, 0, 5};
  resp.per_rank.resize(rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (rows[r] >= 0) resp.per_rank[r] = request(Collective::kAllgather, DataType::kFloat16,
                                                 {rows[r], 2, 4});
  }
  resp.agreed = *resp.per_rank[0];
  AllgatherPlan p = plan_allgather(resp);
  CHECK(p.row_bytes == 16);
  CHECK(p.blocks == std::vector<std::size_t>{48, 0, 0, 80});
  CHECK(p.total_bytes == 128);
  CHECK(p.out_shape == std::vector<std::int64_t>{8, 2, 4});
  // NCCL pads every block to the largest.
  CHECK(largest_block(p.blocks) == 80);

  // Every rank empty: nothing to gather (a backend then moves nothing, on
  // every rank alike).
  for (auto& q : resp.per_rank) {
    if (q) q->shape[0] = 0;
  }
  p = plan_allgather(resp);
  CHECK(largest_block(p.blocks) == 0);
  CHECK(p.total_bytes == 0);
  CHECK(p.out_shape == std::vector<std::int64_t>{0, 2, 4});
  CHECK(largest_block({}) == 0);
}

TEST_CASE("alltoall: this rank's send and receive bytes and the splits it receives",
          "[plan]") {
  // Three ranks, rows of 3 int32 (12 bytes); rank p sends splits[p][q] rows to q.
  const std::vector<std::vector<std::int64_t>> splits = {{1, 2, 0}, {0, 0, 4}, {3, 1, 1}};
  Response resp;
  resp.collective = Collective::kAlltoall;
  for (const auto& s : splits) {
    std::int64_t rows = 0;
    for (auto k : s) rows += k;
    Request q = request(Collective::kAlltoall, DataType::kInt32, {rows, 3});
    q.splits = s;
    resp.per_rank.push_back(q);
  }
  resp.agreed = *resp.per_rank[0];
  for (int me = 0; me < 3; ++me) {
    INFO("rank " << me);
    AlltoallPlan p = plan_alltoall(resp, me);
    std::int64_t rows = 0;
    std::size_t total = 0;
    for (std::size_t q = 0; q < 3; ++q) {
      CHECK(p.send_bytes[q] == static_cast<std::size_t>(splits[me][q]) * 12);
      CHECK(p.received_splits[q] == splits[q][me]);
      CHECK(p.recv_bytes[q] == static_cast<std::size_t>(splits[q][me]) * 12);
      rows += splits[q][me];
      total += p.recv_bytes[q];
    }
    CHECK(p.recv_total == total);
    CHECK(p.out_shape == std::vector<std::int64_t>{rows, 3});
    // The largest message of any pair (rank 1 to rank 2, 4 rows), on every
    // rank, although only ranks 1 and 2 send or receive it.
    CHECK(p.largest_bytes == 4 * 12);
  }
  // Rank 1 receives 2 + 0 + 1 rows.
  CHECK(plan_alltoall(resp, 1).received_splits == std::vector<std::int64_t>{2, 0, 1});
}

TEST_CASE("reduce-scatter: earlier ranks take the extra rows", "[plan]") {
  // 7 rows of 5 elements over 3 ranks: 3, 2, 2 rows.
  Request a = request(Collective::kReducescatter, DataType::kFloat32, {7, 5});
  for (int me = 0; me < 3; ++me) {
    ReduceScatterPlan p = plan_reducescatter(a, 3, me);
    CHECK(p.counts == std::vector<std::size_t>{15, 10, 10});
    CHECK(p.my_count == p.counts[static_cast<std::size_t>(me)]);
    CHECK(p.out_shape == std::vector<std::int64_t>{me == 0 ? 3 : 2, 5});
  }
  // Fewer rows than ranks: the last ranks get none.
  Request few = request(Collective::kReducescatter, DataType::kFloat64, {2});
  ReduceScatterPlan p = plan_reducescatter(few, 4, 3);
  CHECK(p.counts == std::vector<std::size_t>{1, 1, 0, 0});
  CHECK(p.my_count == 0);
  CHECK(p.out_shape == std::vector<std::int64_t>{0});
  // Evenly divisible, one rank.
  CHECK(plan_reducescatter(a, 1, 0).counts == std::vector<std::size_t>{35});
}

TEST_CASE("fused buckets zero the padding and the slots of members without input",
          "[plan]") {
  // Members of 100, 64, 10 and 1 bytes at 0, 128, 192, 256; total 320.
  const std::vector<std::size_t> sizes = {100, 64, 10, 1};
  const FusedLayout l = fused_layout(sizes);
  REQUIRE(l.offsets == std::vector<std::size_t>{0, 128, 192, 256});
  REQUIRE(l.total == 320);
  // Every member present: only the padding after members 0, 2 and 3.
  CHECK(fusion_zero_ranges(l, {true, true, true, true}) ==
        std::vector<ByteRange>{{100, 28}, {202, 54}, {257, 63}});
  // Member 1 joined: its slot merges with the padding before and after it.
  CHECK(fusion_zero_ranges(l, {true, false, true, true}) ==
        std::vector<ByteRange>{{100, 92}, {202, 54}, {257, 63}});
  // Nothing present: the whole buffer, as one range.
  CHECK(fusion_zero_ranges(l, {false, false, false, false}) ==
        std::vector<ByteRange>{{0, 320}});
  // Aligned sizes leave nothing to zero.
  const std::vector<std::size_t> aligned = {64, 128};
  CHECK(fusion_zero_ranges(fused_layout(aligned), {true, true}).empty());
}

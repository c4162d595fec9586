// The parts of the GPU path that need no GPU: what enqueue accepts and
// refuses for CUDA tensors, the device check at negotiation, fusion by
// device, and (in NCCL builds) the dtype and reduce-op tables. Runs in every
// build; the NCCL-only cases are compiled when GYRE_HAVE_NCCL is defined.
// (The padding of allgather blocks for NCCL is planned by execution/plan.h
// and tested with the other plans in tests/core/test_plan.cc.)
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "negotiation/coordinator.h"
#include "fusion/fusion.h"
#include "local_job.h"

#ifdef GYRE_HAVE_NCCL
#include "backends/nccl/nccl_backend.h"
#include "backends/nccl/nccl_device.h"
#endif

using gyre::test::contains;
using gyre::test::expect_throw;
using gyre::test::LocalJob;

namespace {

gyre::TensorView cuda_view(float* host_stand_in, int device_index, std::int64_t n) {
  // The pointer is never dereferenced: every case below is refused at
  // enqueue, before any byte moves.
  gyre::TensorView v;
  v.data = host_stand_in;
  v.dtype = gyre::DataType::kFloat32;
  v.shape = {n};
  v.device = {gyre::DeviceType::kCUDA, device_index};
  return v;
}

gyre::Options quick_options() {
  gyre::Options o;
  o.cycle_time_ms = 0.2;
  o.op_timeout_s = 60;
  return o;
}

#ifdef GYRE_HAVE_NCCL
// Whether this process sees a usable CUDA device (cases that need a
// refusal for "no such device" adapt their expectation).
int visible_devices() {
  std::string why;
  return gyre::core::cuda_device_count(&why);
}
#endif

}  // namespace

TEST_CASE("a CUDA tensor is refused at enqueue with the tensor and device named", "[gpu]") {
  LocalJob::run(1, quick_options(), [](int rank, gyre::core::Runtime& rt) {
    std::vector<float> stand_in(8, 1.0f);
    auto bad = cuda_view(stand_in.data(), 99, 8);
    std::string msg = expect_throw<gyre::InvalidArgument>(
        rank, [&] { gyre::core::allreduce_async(rt, "grad.w", bad, bad, gyre::ReduceOp::kSum); });
    GYRE_EXPECT(rank, contains(msg, "allreduce 'grad.w'"));
    GYRE_EXPECT(rank, contains(msg, "cuda:99"));
#ifdef GYRE_HAVE_NCCL
    // No such device (here: no usable device at all, or fewer than 100).
    GYRE_EXPECT(rank, contains(msg, "but this process sees") ||
                          contains(msg, "no CUDA device is usable"));
    auto negative = cuda_view(stand_in.data(), -1, 8);
    msg = expect_throw<gyre::InvalidArgument>(
        rank, [&] { gyre::core::broadcast_async(rt, "bcast.b", negative, 0); });
    GYRE_EXPECT(rank, contains(msg, "broadcast 'bcast.b'") && contains(msg, "cuda:-1"));
#else
    GYRE_EXPECT(rank, contains(msg, "built without NCCL"));
#endif
    // The runtime goes on: the name is free again and a CPU tensor works.
    std::vector<float> ok(8, 2.0f);
    gyre::TensorView cpu{ok.data(), gyre::DataType::kFloat32, {8}, {}};
    gyre::test::wait_for(gyre::core::allreduce_async(rt, "grad.w", cpu, cpu, gyre::ReduceOp::kSum));
    GYRE_EXPECT(rank, ok[3] == 2.0f);
  });
}

TEST_CASE("fingerprint_check and resync refuse CUDA tensors", "[gpu]") {
  LocalJob::run(1, quick_options(), [](int rank, gyre::core::Runtime& rt) {
    std::vector<float> stand_in(4, 0.0f);
    auto v = cuda_view(stand_in.data(), 0, 4);
    std::string msg = expect_throw<gyre::InvalidArgument>(rank, [&] {
      gyre::core::resync(rt, {{"params.b", v}}, gyre::ResyncPolicy::kNewest);
    });
    GYRE_EXPECT(rank, contains(msg, "'params.b'") && contains(msg, "not supported on CUDA"));
    msg = expect_throw<gyre::InvalidArgument>(rank, [&] {
      gyre::core::fingerprint_check(rt, {{"params.w", v}});
    });
    GYRE_EXPECT(rank, contains(msg, "'params.w'") && contains(msg, "not supported on CUDA"));
  });
}

TEST_CASE("allreduce refuses input and output on different devices", "[gpu]") {
  LocalJob::run(1, quick_options(), [](int rank, gyre::core::Runtime& rt) {
    std::vector<float> a(4, 0.0f), b(4, 0.0f);
    gyre::TensorView cpu{a.data(), gyre::DataType::kFloat32, {4}, {}};
    auto gpu = cuda_view(b.data(), 0, 4);
    std::string msg = expect_throw<gyre::InvalidArgument>(
        rank, [&] { gyre::core::allreduce_async(rt, "mixed", cpu, gpu, gyre::ReduceOp::kSum); });
    GYRE_EXPECT(rank, contains(msg, "allreduce 'mixed'"));
#ifdef GYRE_HAVE_NCCL
    // With a device 0 the check of the pair itself answers; without one,
    // the output's device is refused first.
    if (visible_devices() > 0) {
      GYRE_EXPECT(rank, contains(msg, "output is on cuda:0 but input on cpu:0"));
    } else {
      GYRE_EXPECT(rank, contains(msg, "output is on cuda:0"));
    }
#else
    GYRE_EXPECT(rank, contains(msg, "output is on cuda:0") && contains(msg, "without NCCL"));
#endif
  });
}

TEST_CASE("a rank refusing a CUDA tensor fails the operation on the other ranks", "[gpu]") {
  LocalJob::run(2, quick_options(), [](int rank, gyre::core::Runtime& rt) {
    std::vector<float> buf(6, 1.0f);
    if (rank == 0) {
      auto bad = cuda_view(buf.data(), 42, 6);
      expect_throw<gyre::InvalidArgument>(
          rank, [&] { gyre::core::allreduce_async(rt, "layer1", bad, bad, gyre::ReduceOp::kSum); });
    } else {
      gyre::TensorView cpu{buf.data(), gyre::DataType::kFloat32, {6}, {}};
      auto h = gyre::core::allreduce_async(rt, "layer1", cpu, cpu, gyre::ReduceOp::kSum);
      std::string msg = expect_throw<gyre::InvalidArgument>(rank, [&] { gyre::test::wait_for(h); });
      GYRE_EXPECT(rank, contains(msg, "failed on rank 0") && contains(msg, "cuda:42"));
    }
    // Rank 0 stays up until rank 1 has its answer (its shutdown would stop both runtimes).
    gyre::core::barrier(rt);
  });
}

TEST_CASE("negotiation fails a tensor that is on CUDA on one rank and on the CPU on another",
          "[gpu]") {
  using namespace gyre::core;
  Coordinator coord(3, 0, 0.0);
  ResponseCache cache(16);
  std::vector<RoundMessage> msgs(3);
  for (int r = 0; r < 3; ++r) {
    Request req;
    req.name = "emb";
    req.collective = Collective::kAllreduce;
    req.shape = {10};
    // Ranks 0 and 2 on CUDA (different GPUs: allowed), rank 1 on the CPU.
    if (r != 1) req.device = {gyre::DeviceType::kCUDA, r};
    msgs[static_cast<std::size_t>(r)].requests.push_back(req);
  }
  RoundOutcome out = coord.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);
  const Response& resp = out.responses[0];
  CHECK(resp.error_kind == ErrorKind::kMismatch);
  CHECK_THAT(resp.error, Catch::Contains("allreduce 'emb'") &&
                             Catch::Contains("ranks disagree on device") &&
                             Catch::Contains("ranks 0, 2 have cuda") &&
                             Catch::Contains("rank 1 has cpu"));

  // Same device type, different indices: agreed.
  Coordinator coord2(2, 0, 0.0);
  std::vector<RoundMessage> msgs2(2);
  for (int r = 0; r < 2; ++r) {
    Request req;
    req.name = "emb";
    req.shape = {10};
    req.device = {gyre::DeviceType::kCUDA, 1 - r};
    msgs2[static_cast<std::size_t>(r)].requests.push_back(req);
  }
  RoundOutcome out2 = coord2.process(msgs2, cache, Clock::now());
  REQUIRE(out2.responses.size() == 1);
  CHECK(out2.responses[0].ok());
}

TEST_CASE("fusion never puts CPU and CUDA tensors in one bucket", "[gpu]") {
  using namespace gyre::core;
  const gyre::Device cpu{};
  const gyre::Device gpu{gyre::DeviceType::kCUDA, 0};
  std::vector<FusionItem> items = {
      {true, gyre::DataType::kFloat32, gyre::ReduceOp::kSum, 1.0, 1.0, cpu, 100},
      {true, gyre::DataType::kFloat32, gyre::ReduceOp::kSum, 1.0, 1.0, gpu, 100},
      {true, gyre::DataType::kFloat32, gyre::ReduceOp::kSum, 1.0, 1.0, cpu, 100},
      {true, gyre::DataType::kFloat32, gyre::ReduceOp::kSum, 1.0, 1.0, gpu, 100},
  };
  auto buckets = plan_buckets(items, 1 << 20);
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0].members == std::vector<std::size_t>{0, 2});
  CHECK(buckets[1].members == std::vector<std::size_t>{1, 3});
}

#ifdef GYRE_HAVE_NCCL
TEST_CASE("every gyre dtype maps to the NCCL type of the same representation", "[gpu][nccl]") {
  using gyre::DataType;
  using gyre::core::nccl_dtype;
  const std::vector<std::pair<DataType, ncclDataType_t>> expected = {
      {DataType::kFloat32, ncclFloat32}, {DataType::kFloat64, ncclFloat64},
      {DataType::kFloat16, ncclFloat16}, {DataType::kBFloat16, ncclBfloat16},
      {DataType::kInt8, ncclInt8},       {DataType::kUInt8, ncclUint8},
      {DataType::kInt32, ncclInt32},     {DataType::kInt64, ncclInt64},
  };
  // int16 (NCCL has no such type) and bool (a sum would count, not or) have
  // none: their reductions are refused on CUDA tensors.
  const std::vector<DataType> without = {DataType::kInt16, DataType::kBool};
  REQUIRE(expected.size() + without.size() == static_cast<std::size_t>(gyre::kNumDataTypes));
  for (const auto& [dt, nt] : expected) {
    INFO(gyre::dtype_name(dt));
    REQUIRE(nccl_dtype(dt).has_value());
    CHECK(*nccl_dtype(dt) == nt);
  }
  for (DataType dt : without) CHECK_FALSE(nccl_dtype(dt).has_value());
  // Distinct gyre types never share an NCCL type.
  for (std::size_t a = 0; a < expected.size(); ++a) {
    for (std::size_t b = a + 1; b < expected.size(); ++b) {
      CHECK(expected[a].second != expected[b].second);
    }
  }
}

TEST_CASE("reduce ops map to NCCL's; average is left to the executor", "[gpu][nccl]") {
  using gyre::ReduceOp;
  using gyre::core::nccl_op;
  CHECK(nccl_op(ReduceOp::kSum) == ncclSum);
  CHECK(nccl_op(ReduceOp::kMin) == ncclMin);
  CHECK(nccl_op(ReduceOp::kMax) == ncclMax);
  CHECK(nccl_op(ReduceOp::kProduct) == ncclProd);
  // ncclAvg would divide by every rank, joined ones included.
  CHECK_FALSE(nccl_op(ReduceOp::kAverage).has_value());
  CHECK_FALSE(nccl_op(ReduceOp::kAdasum).has_value());  // CPU only
}

TEST_CASE("CUDA and NCCL failures become TransportError naming the call", "[gpu][nccl]") {
  using gyre::core::check_cuda;
  using gyre::core::check_nccl;
  CHECK_NOTHROW(check_cuda(cudaSuccess, "x"));
  CHECK_NOTHROW(check_nccl(ncclSuccess, "x"));
  try {
    check_cuda(cudaErrorMemoryAllocation, "allreduce 'w': cudaMalloc");
    FAIL("no exception");
  } catch (const gyre::TransportError& e) {
    CHECK_THAT(e.what(), Catch::StartsWith("allreduce 'w': cudaMalloc: CUDA error "
                                           "cudaErrorMemoryAllocation (") &&
                             Catch::Contains("out of memory"));
  }
  try {
    check_nccl(ncclInvalidArgument, "broadcast 'b': ncclBroadcast");
    FAIL("no exception");
  } catch (const gyre::TransportError& e) {
    CHECK_THAT(e.what(), Catch::StartsWith("broadcast 'b': ncclBroadcast: NCCL error 4 (") &&
                             Catch::Contains("invalid argument"));
  }
}
#endif

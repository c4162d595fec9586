// gyre::view (gyre/view.h): the dtype deduced from the element type, the
// shape defaulted and checked, const data viewed for the roles gyre reads.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gyre/view.h"

using namespace gyre;

TEST_CASE("view deduces the dtype of every element type gyre has", "[view]") {
  std::vector<float> f32(2);
  std::vector<double> f64(2);
  std::vector<float16_t> f16(2);
  std::vector<bfloat16_t> bf16(2);
  std::vector<std::int8_t> i8(2);
  std::vector<std::uint8_t> u8(2);
  std::vector<std::int16_t> i16(2);
  std::vector<std::int32_t> i32(2);
  std::vector<std::int64_t> i64(2);
  std::array<bool, 2> b{};
  CHECK(view(f32).dtype == DataType::kFloat32);
  CHECK(view(f64).dtype == DataType::kFloat64);
  CHECK(view(f16).dtype == DataType::kFloat16);
  CHECK(view(bf16).dtype == DataType::kBFloat16);
  CHECK(view(i8).dtype == DataType::kInt8);
  CHECK(view(u8).dtype == DataType::kUInt8);
  CHECK(view(i16).dtype == DataType::kInt16);
  CHECK(view(i32).dtype == DataType::kInt32);
  CHECK(view(i64).dtype == DataType::kInt64);
  CHECK(view(std::span<bool>(b)).dtype == DataType::kBool);
  CHECK(sizeof(float16_t) == 2);
  CHECK(sizeof(bfloat16_t) == 2);
}

TEST_CASE("view points at the data and takes its shape", "[view]") {
  std::vector<float> x(6);
  TensorView flat = view(x);
  CHECK(flat.data == x.data());
  CHECK(flat.shape == std::vector<std::int64_t>{6});
  CHECK(flat.numel() == 6);
  CHECK(flat.nbytes() == 6 * sizeof(float));

  TensorView matrix = view(std::span<float>(x), {2, 3});
  CHECK(matrix.data == x.data());
  CHECK(matrix.shape == std::vector<std::int64_t>{2, 3});

  const std::vector<std::int32_t> c{1, 2, 3, 4};
  TensorView read_only = view(c, {4, 1});
  CHECK(read_only.data == c.data());
  CHECK(read_only.dtype == DataType::kInt32);

  std::vector<double> empty;
  CHECK(view(empty).numel() == 0);
  CHECK(view(empty, {0, 5}).numel() == 0);
}

TEST_CASE("view refuses a shape whose element count is not the data's", "[view]") {
  std::vector<float> x(6);
  CHECK_THROWS_AS(view(x, {4}), InvalidArgument);
  CHECK_THROWS_AS(view(x, {2, 2}), InvalidArgument);
  CHECK_THROWS_AS(view(std::span<float>(x).first(5), {2, 3}), InvalidArgument);
  try {
    view(x, {7});
    FAIL("no exception");
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    CHECK(what.find("gyre::view") != std::string::npos);
    CHECK(what.find("7 elements over 6 elements") != std::string::npos);
  }
}

// PartialStore (partial_local_sgd_state.h): PartialLocalSgd's tensors in the
// parameter store, their registration, and the pulls and "apply" pushes both
// of its sides make, converting between float64 and the wire dtype.
#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/view.h"
#include "training/partial_local_sgd_state.h"

namespace gyre::core::partial {

namespace {

// `values` in the wire dtype, as bytes (float32 rounds each value once).
std::vector<std::byte> to_wire(const std::vector<double>& values, DataType wire) {
  std::vector<std::byte> out(values.size() * dtype_size(wire));
  if (wire == DataType::kFloat64) {
    if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
    return out;
  }
  auto* f = reinterpret_cast<float*>(out.data());
  for (std::size_t k = 0; k < values.size(); ++k) f[k] = static_cast<float>(values[k]);
  return out;
}

void from_wire(const std::vector<std::byte>& bytes, DataType wire, std::vector<double>& out) {
  out.resize(bytes.size() / dtype_size(wire));
  if (wire == DataType::kFloat64) {
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return;
  }
  const auto* f = reinterpret_cast<const float*>(bytes.data());
  for (std::size_t k = 0; k < out.size(); ++k) out[k] = f[k];
}

TensorView wire_view(std::vector<std::byte>& bytes, DataType wire) {
  return TensorView{bytes.empty() ? nullptr : bytes.data(), wire,
                    {static_cast<std::int64_t>(bytes.size() / dtype_size(wire))}};
}

}  // namespace

PartialStore::PartialStore(const PartialLocalSgdOptions& o, double timeout_s, DataType wire,
                           int n, const std::vector<double>& model)
    : store_(o.process_set, StoreOptions{.timeout_s = timeout_s}),
      wire_(wire),
      np_(model.size()),
      timeout_s_(timeout_s),
      model_(o.name + ".model"),
      posted_(o.name + ".posted"),
      meta_(o.name + ".meta") {
  std::vector<std::byte> bytes = to_wire(model, wire);
  store_.register_tensor(model_, wire_view(bytes, wire));
  bytes = to_wire(std::vector<double>(np_ + 1, 0.0), wire);
  for (int i = 0; i < n; ++i) {
    slots_.push_back(fmt::format("{}.slot.{}", o.name, i));
    store_.register_tensor(slots_.back(), wire_view(bytes, wire));
  }
  std::vector<std::int64_t> zeros(static_cast<std::size_t>(3 * n), 0);
  store_.register_tensor(posted_, view(zeros));
  zeros.assign(static_cast<std::size_t>(3 + 4 * n), 0);
  store_.register_tensor(meta_, view(zeros));
  for (const std::string* name : {&model_, &posted_, &meta_}) {
    shards_[*name] = store_.shard_owners(*name).size();
  }
  for (const std::string& s : slots_) shards_[s] = store_.shard_owners(s).size();
}

PushItem PartialStore::apply_item(const std::string& name, TensorView delta) const {
  PushItem item;
  item.name = name;
  item.delta = std::move(delta);
  item.base_version.assign(shards_.at(name), 0);  // ignored by the apply policy
  item.staleness = -1;
  item.policy = PushPolicy::kApply;
  return item;
}

void PartialStore::add(const std::string& name, const std::vector<double>& delta) {
  std::vector<std::byte> bytes = to_wire(delta, wire_);
  store_.push_many({apply_item(name, wire_view(bytes, wire_))});
}

void PartialStore::add_ints(const std::string& name, const std::vector<std::int64_t>& delta) {
  store_.push_many({apply_item(name, view(delta))});
}

std::int64_t PartialStore::pull(const std::string& name, std::vector<double>& out) {
  // The registered size: the model's np values, a mailbox's np + 1.
  std::vector<std::byte> bytes((name == model_ ? np_ : np_ + 1) * dtype_size(wire_));
  const auto version = store_.pull(name, wire_view(bytes, wire_));
  from_wire(bytes, wire_, out);
  return version.empty() ? 0 : version.front();
}

std::vector<std::int64_t> PartialStore::pull_ints(const std::string& name) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(name == posted_ ? slots_.size() * 3
                                                                         : 3 + slots_.size() * 4));
  store_.pull(name, view(out));
  return out;
}

void PartialStore::pull_many(const std::vector<std::string>& names,
                             std::vector<std::vector<double>>& out) {
  std::vector<std::vector<std::byte>> bytes(names.size());
  std::vector<PullItem> items;
  for (std::size_t i = 0; i < names.size(); ++i) {
    bytes[i].resize((names[i] == model_ ? np_ : np_ + 1) * dtype_size(wire_));
    items.push_back({names[i], wire_view(bytes[i], wire_)});
  }
  store_.pull_many(items);
  out.resize(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) from_wire(bytes[i], wire_, out[i]);
}

std::int64_t PartialStore::pull_model(std::vector<double>& out) {
  const auto start = Clock::now();
  Backoff backoff;
  std::vector<std::byte> bytes(np_ * dtype_size(wire_));
  while (true) {
    const auto version = store_.pull(model_, wire_view(bytes, wire_));
    if (std::all_of(version.begin(), version.end(),
                    [&](std::int64_t v) { return v == version.front(); })) {
      from_wire(bytes, wire_, out);
      return version.empty() ? 0 : version.front();
    }
    if (seconds_since(start) > timeout_s_) {
      throw TimeoutError(fmt::format(
          "PartialLocalSgd: the model's shards stayed at different versions ({}) for {:g} s",
          fmt::join(version, ", "), timeout_s_));
    }
    backoff.nap();
  }
}

}  // namespace gyre::core::partial

// gyre._gyre.ParameterStore: gyre::ParameterStore on Python tensors (store.h).
// Every call releases the GIL while it communicates; the imported tensors
// are released with the GIL held (tensor_import.h).
#include "store.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "gyre/store.h"
#include "tensor_import.h"

namespace gyre::python {

namespace py = pybind11;

namespace {

PushPolicy policy_of(const std::string& name) {
  if (name == "reject") return PushPolicy::kReject;
  if (name == "apply") return PushPolicy::kApply;
  if (name == "scale") return PushPolicy::kScale;
  throw InvalidArgument("ParameterStore.push: policy must be 'reject', 'apply' or 'scale', not '" +
                        name + "'");
}

}  // namespace

void bind_store(py::module_& m) {
  py::class_<ParameterStore>(m, "ParameterStore")
      .def(py::init([](int process_set, std::size_t split_bytes, double timeout_s) {
             StoreOptions o;
             o.split_bytes = split_bytes;
             o.timeout_s = timeout_s;
             py::gil_scoped_release release;
             return std::make_unique<ParameterStore>(process_set, o);
           }),
           py::arg("process_set"), py::arg("split_bytes"), py::arg("timeout_s"))
      .def("register_tensor",
           [](ParameterStore& s, const std::string& name, py::handle value) {
             auto t = ImportedTensor::convert(value, "the value of '" + name + "'", Access::kRead);
             py::gil_scoped_release release;
             s.register_tensor(name, t->view());
           })
      .def("pull",
           [](ParameterStore& s, const std::string& name, py::handle out) {
             auto t = ImportedTensor::convert(out, "the output", Access::kWrite);
             std::vector<std::int64_t> versions;
             {
               py::gil_scoped_release release;
               versions = s.pull(name, t->view());
             }
             t->mark_completed(true);
             const std::string why = t->write_back();
             if (!why.empty()) throw InvalidArgument("ParameterStore.pull: " + why);
             return versions;
           })
      .def("push",
           [](ParameterStore& s, const std::string& name, py::handle delta,
              const std::vector<std::int64_t>& base, std::int64_t staleness,
              const std::string& policy, const std::vector<int>& only) {
             const PushPolicy p = policy_of(policy);
             auto t = ImportedTensor::convert(delta, "the delta", Access::kRead);
             PushResult r;
             {
               py::gil_scoped_release release;
               r = s.push(name, t->view(), base, staleness, p, only);
             }
             return py::make_tuple(r.applied, r.version, r.shard_applied, r.lag,
                                   r.rejected_shards);
           })
      .def("pull_many",
           [](ParameterStore& s, const std::vector<std::string>& names, const py::list& outs) {
             if (outs.size() != names.size()) {
               throw InvalidArgument("ParameterStore.pull_many: as many outputs as names");
             }
             std::vector<std::unique_ptr<ImportedTensor>> held;
             std::vector<PullItem> items;
             for (std::size_t i = 0; i < names.size(); ++i) {
               held.push_back(ImportedTensor::convert(outs[i], "the output of '" + names[i] + "'",
                                                      Access::kWrite));
               items.push_back(PullItem{names[i], held.back()->view()});
             }
             std::vector<std::vector<std::int64_t>> versions;
             {
               py::gil_scoped_release release;
               versions = s.pull_many(items);
             }
             for (auto& t : held) {
               t->mark_completed(true);
               const std::string why = t->write_back();
               if (!why.empty()) throw InvalidArgument("ParameterStore.pull_many: " + why);
             }
             return versions;
           })
      .def("push_many",
           [](ParameterStore& s, const std::vector<std::string>& names, const py::list& deltas,
              const std::vector<std::vector<std::int64_t>>& bases,
              const std::vector<std::int64_t>& staleness, const std::vector<std::string>& policies,
              const std::vector<std::vector<int>>& only) {
             const std::size_t n = names.size();
             if (deltas.size() != n || bases.size() != n || staleness.size() != n ||
                 policies.size() != n || only.size() != n) {
               throw InvalidArgument("ParameterStore.push_many: one delta, base version, "
                                     "staleness, policy and shard list per name");
             }
             std::vector<std::unique_ptr<ImportedTensor>> held;
             std::vector<PushItem> items;
             for (std::size_t i = 0; i < n; ++i) {
               const PushPolicy p = policy_of(policies[i]);
               held.push_back(ImportedTensor::convert(deltas[i], "the delta of '" + names[i] + "'",
                                                      Access::kRead));
               items.push_back(PushItem{names[i], held.back()->view(), bases[i], staleness[i], p,
                                        only[i]});
             }
             std::vector<PushResult> results;
             {
               py::gil_scoped_release release;
               results = s.push_many(items);
             }
             py::list out;
             for (const PushResult& r : results) {
               out.append(py::make_tuple(r.applied, r.version, r.shard_applied, r.lag,
                                         r.rejected_shards));
             }
             return out;
           })
      .def("shard_owners", &ParameterStore::shard_owners)
      .def("check_members", &ParameterStore::check_members)
      .def("stats",
           [](const ParameterStore& s) {
             const StoreStats st = s.stats();
             py::dict d;
             d["pulls"] = st.pulls;
             d["pushes"] = st.pushes;
             d["pushes_applied"] = st.pushes_applied;
             d["pushes_rejected"] = st.pushes_rejected;
             d["pushes_scaled"] = st.pushes_scaled;
             d["served_requests"] = st.served_requests;
             d["max_lag_seen"] = st.max_lag_seen;
             return d;
           })
      .def("close", &ParameterStore::close, py::call_guard<py::gil_scoped_release>());
}

}  // namespace gyre::python

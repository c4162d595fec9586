// The extension module gyre._gyre: type conversion and GIL handling around
// the C++ API, nothing more. Argument defaults, generated names, framework
// conversions and the Horovod-style API live in the Python package; every
// argument check is the runtime's (core/src/api/operations.cc), which
// announces a refusal to the other ranks.
//
// Threads: every function is called from Python threads with the GIL held;
// each releases it around any call that can block on the runtime.
#include <dlpack/dlpack.h>
#include <mpi.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "bootstrap.h"
#include "call.h"
#include "exceptions.h"
#include "gyre/gyre.h"
#include "host_pool.h"
#include "output_tensor.h"
#include "shared_buffer.h"
#include "store.h"
#include "pending_op.h"
#include "tensor_import.h"
#include "torch_objects.h"

namespace py = pybind11;

namespace gyre::python {
namespace {

// Runs f with the GIL released after destroying finished operations' tensors.
template <typename F>
auto blocking(F&& f) {
  drain_graveyard();
  py::gil_scoped_release release;
  return f();
}

// fresh_output: `out` was made for this call and nobody else holds it until
// the operation completes (Access::kWriteNew).
// wait_follows: the caller waits for the operation at once (a blocking
// call): gyre::WaitFollows, where PendingOp's wait runs the rounds as the
// promise needs.
std::shared_ptr<PendingOp> allreduce(const std::string& name, py::handle in, py::handle out, int op,
                                     double pre, double post, const std::string& refusal,
                                     int process_set, bool fresh_output, bool wait_follows) {
  Call call(refusal);
  const ReduceOp rop = call.op(op);
  TensorView vin = call.view(in, "input", out.is_none() ? Access::kWrite : Access::kRead);
  const Access out_access = fresh_output ? Access::kWriteNew : Access::kWrite;
  TensorView vout = out.is_none() ? vin : call.view(out, "output", out_access);
  return call.start([&] {
    std::optional<WaitFollows> promise;
    if (wait_follows && PendingOp::waits_run_rounds()) promise.emplace();
    return allreduce_async(name, vin, vout, rop, pre, post, process_set);
  });
}

// Out of place into a new output: from the output pool when the input is a
// CPU tensor of at least kPooledMinBytes (host_pool.h), else None
// and the caller allocates (allreduce() with an output).
py::object allreduce_pooled(const std::string& name, py::handle in, int op, double pre,
                            double post, const std::string& refusal, int process_set) {
  Call call(refusal);
  const ReduceOp rop = call.op(op);
  TensorView vin = call.view(in, "input", Access::kRead);
  if (!vin.refusal.empty() || vin.device.type != DeviceType::kCPU ||
      vin.nbytes() < kPooledMinBytes) {
    return py::none();
  }
  auto block = acquire_host_block(vin.nbytes());
  TensorView vout = vin;
  vout.data = block.get();
  OutputTensor out(block, vin.dtype, vin.shape);
  auto pending =
      call.start([&] { return allreduce_async(name, vin, vout, rop, pre, post, process_set); });
  return py::make_tuple(pending, out);
}

std::shared_ptr<PendingOp> grouped_allreduce(const std::vector<std::string>& names,
                                             const py::sequence& ins, py::handle outs, int op,
                                             double pre, double post, const std::string& refusal,
                                             int process_set) {
  Call call(refusal);
  const ReduceOp rop = call.op(op);
  const bool in_place = outs.is_none();
  std::vector<TensorView> vins, vouts;
  for (std::size_t i = 0; i < py::len(ins); ++i) {
    vins.push_back(call.view(ins[i], "input", in_place ? Access::kWrite : Access::kRead));
  }
  if (in_place) {
    vouts = vins;
  } else {
    const auto out_seq = py::reinterpret_borrow<py::sequence>(outs);
    for (std::size_t i = 0; i < py::len(out_seq); ++i) {
      vouts.push_back(call.view(out_seq[i], "output", Access::kWrite));
    }
  }
  // Counts that differ are the runtime's to refuse (and announce).
  return call.start([&] {
    return grouped_allreduce_async(names, vins, vouts, rop, pre, post, process_set);
  });
}

std::vector<NamedBuffer> import_named(const std::vector<std::pair<std::string, py::object>>& items,
                                      Access access, Imports& keep) {
  std::vector<NamedBuffer> buffers;
  for (const auto& [name, obj] : items) {
    keep.push_back(ImportedTensor::convert(obj, "buffer '" + name + "'", access));
    buffers.push_back(NamedBuffer{name, keep.back()->view()});
  }
  return buffers;
}

void bind_operations(py::module_& m) {
  // Every operation takes `refusal`: why the Python layer could not convert
  // an argument (empty: it could). The runtime then refuses the call.
  m.def("allreduce", &allreduce, py::arg("name"), py::arg("input"), py::arg("output"),
        py::arg("op"), py::arg("prescale"), py::arg("postscale"), py::arg("refusal") = "",
        py::arg("process_set") = 0, py::arg("fresh_output") = false,
        py::arg("wait_follows") = false,
        "Enqueues an allreduce; output=None reduces in place. wait_follows: the caller waits "
        "for it at once (gyre::WaitFollows).");
  m.def("allreduce_pooled", &allreduce_pooled, py::arg("name"), py::arg("input"), py::arg("op"),
        py::arg("prescale"), py::arg("postscale"), py::arg("refusal") = "",
        py::arg("process_set") = 0,
        "Enqueues an allreduce into a new output from gyre's pool: (pending, output), or None "
        "(nothing enqueued) when the input is not a CPU tensor of at least 1 MiB.");
  m.def("grouped_allreduce", &grouped_allreduce, py::arg("names"), py::arg("inputs"),
        py::arg("outputs"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
        py::arg("refusal") = "", py::arg("process_set") = 0);
  m.def(
      "allgather",
      [](const std::string& name, py::handle in, const std::string& refusal, int process_set) {
        Call call(refusal);
        TensorView v = call.view(in, "input", Access::kRead);
        return call.start([&] { return allgather_async(name, v, process_set); });
      },
      py::arg("name"), py::arg("input"), py::arg("refusal") = "", py::arg("process_set") = 0);
  m.def(
      "broadcast",
      [](const std::string& name, py::handle buf, int root, const std::string& refusal,
         int process_set) {
        Call call(refusal);
        TensorView v = call.view(buf, "buffer", Access::kWrite);
        return call.start([&] { return broadcast_async(name, v, root, process_set); });
      },
      py::arg("name"), py::arg("buffer"), py::arg("root"), py::arg("refusal") = "",
      py::arg("process_set") = 0);
  m.def(
      "alltoall",
      [](const std::string& name, py::handle in, const std::vector<std::int64_t>& splits,
         const std::string& refusal, int process_set) {
        Call call(refusal);
        TensorView v = call.view(in, "input", Access::kRead);
        return call.start([&] { return alltoall_async(name, v, splits, process_set); });
      },
      py::arg("name"), py::arg("input"), py::arg("splits"), py::arg("refusal") = "",
      py::arg("process_set") = 0);
  m.def(
      "reducescatter",
      [](const std::string& name, py::handle in, int op, double pre, double post,
         const std::string& refusal, int process_set) {
        Call call(refusal);
        const ReduceOp rop = call.op(op);
        TensorView v = call.view(in, "input", Access::kRead);
        return call.start(
            [&] { return reducescatter_async(name, v, rop, pre, post, process_set); });
      },
      py::arg("name"), py::arg("input"), py::arg("op"), py::arg("prescale"),
      py::arg("postscale"), py::arg("refusal") = "", py::arg("process_set") = 0);
  m.attr("ANY_SOURCE") = kAnySource;
  m.def(
      "send",
      [](py::handle t, int dst, std::int64_t tag, const std::string& refusal, int process_set) {
        Call call(refusal);
        TensorView v = call.view(t, "tensor", Access::kRead);
        return call.start([&] { return send_async(v, dst, tag, process_set); });
      },
      py::arg("tensor"), py::arg("dst"), py::arg("tag") = 0, py::arg("refusal") = "",
      py::arg("process_set") = 0,
      "Sends the tensor to world rank dst of the process set; PendingOp.source_rank() is dst.");
  m.def(
      "recv",
      [](py::handle t, int src, std::int64_t tag, const std::string& refusal, int process_set) {
        Call call(refusal);
        TensorView v = call.view(t, "tensor", Access::kWrite);
        return call.start([&] { return recv_async(v, src, tag, process_set); });
      },
      py::arg("tensor"), py::arg("src"), py::arg("tag") = 0, py::arg("refusal") = "",
      py::arg("process_set") = 0,
      "Receives into the tensor from world rank src (ANY_SOURCE: any rank of the set); "
      "PendingOp.source_rank() is the sender's world rank.");
}

void bind_divergence(py::module_& m) {
  m.def("commit_step", [] { blocking([] { commit_step(); }); });
  m.def("committed_steps", [] { return blocking([] { return committed_steps(); }); });
  m.def("version_vector", [] { return blocking([] { return version_vector(); }); });
  m.def("runtime_stats", [] {
    const RuntimeStats st = blocking([] { return runtime_stats(); });
    py::dict d;
    d["rounds"] = st.rounds;
    d["requests_sent"] = st.requests_sent;
    d["cache_hits_sent"] = st.cache_hits_sent;
    d["log_depth_rounds"] = st.log_depth_rounds;
    d["speculated_allreduces"] = st.speculated_allreduces;
    d["speculation"] = st.speculation;
    d["negotiation_messages"] = st.negotiation_messages;
    d["negotiation_tier_hosts"] = st.negotiation_tier_hosts;
    d["caller_rounds"] = st.caller_rounds;
    d["rounds_left_to_callers"] = st.rounds_left_to_callers;
    d["caller_handoffs"] = st.caller_handoffs;
    d["transport_messages"] = st.transport_messages;
    d["transport_bytes"] = st.transport_bytes;
    d["versions"] = st.versions;
    d["behind"] = st.behind;
    d["store_pushes"] = st.store_pushes;
    d["store_pushes_applied"] = st.store_pushes_applied;
    d["store_pushes_rejected"] = st.store_pushes_rejected;
    d["store_pushes_scaled"] = st.store_pushes_scaled;
    d["store_max_lag"] = st.store_max_lag;
    d["link"] = py::dict(py::arg("source") = st.link_source, py::arg("net_alpha_s") = st.net_alpha_s,
                         py::arg("net_bytes_per_s") = st.net_bytes_per_s,
                         py::arg("shm_alpha_s") = st.shm_alpha_s,
                         py::arg("shm_bytes_per_s") = st.shm_bytes_per_s);
    py::list tuned;
    for (const auto& t : st.autotune) {
      tuned.append(py::dict(py::arg("min_bytes") = t.min_bytes, py::arg("trials") = t.trials,
                            py::arg("flat_s_per_mib") = t.flat_s_per_mib,
                            py::arg("hierarchical_s_per_mib") = t.hierarchical_s_per_mib,
                            py::arg("model") = t.model_hierarchical ? "hierarchical" : "flat",
                            py::arg("chosen") = t.hierarchical ? "hierarchical" : "flat"));
    }
    d["autotune"] = tuned;
    d["pool_allreduces"] = st.pool_allreduces;
    return d;
  });
  m.def(
      "fingerprint_check",
      [](const std::vector<std::pair<std::string, py::object>>& items) {
        drain_graveyard();
        Imports keep;
        auto buffers = import_named(items, Access::kRead, keep);
        // The tensors stay alive with the operation, even if Ctrl-C ends
        // the wait (see barrier).
        auto op = PendingOp::start(std::move(keep),
                                   [&] { return fingerprint_check_async(buffers); });
        op->wait();
        py::list out;
        for (const auto& mm : op->handle().mismatches()) {
          out.append(py::make_tuple(mm.name, mm.groups));
        }
        return out;
      },
      py::arg("buffers"),
      "[(name, tensor)] -> [(name, [(digest, [ranks])])] for the buffers that differ.");
  m.def(
      "resync",
      [](const std::vector<std::pair<std::string, py::object>>& items, const std::string& policy) {
        drain_graveyard();
        ResyncPolicy p;
        if (policy == "newest") {
          p = ResyncPolicy::kNewest;
        } else if (policy == "average") {
          p = ResyncPolicy::kAverage;
        } else {
          throw InvalidArgument("resync: unknown policy '" + policy +
                                "' (expected 'newest' or 'average')");
        }
        Imports keep;
        auto buffers = import_named(items, Access::kWrite, keep);
        PendingOp::start(std::move(keep), [&] { return resync_async(buffers, p); })->wait();
      },
      py::arg("buffers"), py::arg("policy"));
}

}  // namespace
}  // namespace gyre::python

// A copy of host memory on its own thread, without the GIL: TorchState.commit()'s background
// copy (gyre.torch.elastic; the caller keeps the buffers alive and unchanged until wait()).
class BackgroundCopy {
 public:
  using Item = std::tuple<std::uintptr_t, std::uintptr_t, std::size_t>;  // dst, src, bytes
  explicit BackgroundCopy(std::vector<Item> items)
      : items_(std::move(items)), thread_([this] {
          for (const auto& [dst, src, bytes] : items_) {
            std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
          }
        }) {}
  ~BackgroundCopy() {
    if (thread_.joinable()) thread_.join();
  }
  BackgroundCopy(const BackgroundCopy&) = delete;
  BackgroundCopy& operator=(const BackgroundCopy&) = delete;
  void wait() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::vector<Item> items_;
  std::thread thread_;
};

PYBIND11_MODULE(_gyre, m) {
  using namespace gyre::python;
  m.doc() = "gyre's C++ runtime; use the gyre and gyre.torch packages instead.";
  register_translator();
  register_fork_handlers();
  register_exit_hook();
  m.def("_set_exception_classes", &set_exception_classes);
  m.def("_torch_in_flight_mode", &torch_in_flight_mode);  // "pin", "copy", "": torch_objects.h
  bind_output_tensor(m);
  bind_store(m);
  bind_bootstrap(m);

  py::class_<PendingOp, std::shared_ptr<PendingOp>>(m, "PendingOp")
      .def("poll",
           [](const PendingOp& op) {
             drain_graveyard();
             return op.poll();
           })
      .def("wait", &PendingOp::wait)
      .def("add_done_callback", &PendingOp::add_done_callback, py::arg("fn"),
           "Calls fn() on one of gyre's callback threads (GIL held) once the operation completes.")
      .def("output", [](const PendingOp& op) { return OutputTensor(op.handle()); })
      .def("received_splits",
           [](const PendingOp& op) { return op.handle().received_splits(); })
      .def("source_rank", [](const PendingOp& op) { return op.handle().source_rank(); });

  m.attr("built_with_nccl") = gyre::nccl_built();
  // DLPack device types, for the Python package (gyre/_tensors.py).
  m.attr("DLPACK_CPU") = static_cast<int>(kDLCPU);
  m.attr("DLPACK_CUDA") = static_cast<int>(kDLCUDA);
  m.attr("DLPACK_CUDA_HOST") = static_cast<int>(kDLCUDAHost);
  m.attr("DLPACK_CUDA_MANAGED") = static_cast<int>(kDLCUDAManaged);
  m.attr("DLPACK_ROCM") = static_cast<int>(kDLROCM);
  // Ctrl-C interrupts init() while it waits for the other ranks: the check
  // runs on the thread in init(), which released the GIL in blocking().
  gyre::set_init_interrupt_check([] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  });
  // `ranks`: Horovod's init(comm): those ranks of MPI_COMM_WORLD alone;
  // empty: every rank.
  m.def("init", [](const std::vector<int>& ranks) {
    blocking([&] {
      if (ranks.empty()) {
        gyre::init();
      } else {
        gyre::init(ranks);
      }
    });
  }, py::arg("ranks") = std::vector<int>{});
  m.def("shutdown", [] {
    blocking([] { gyre::shutdown(); });
    drain_graveyard();
  });
  // Everything that takes the API's lock releases the GIL first: init()
  // holds that lock while it waits and takes the GIL for its Ctrl-C check.
  m.def("is_initialized", [] { return blocking([] { return gyre::is_initialized(); }); });
  m.def("rank", [] { return blocking([] { return gyre::rank(); }); });
  m.def("size", [] { return blocking([] { return gyre::size(); }); });
  m.def("local_rank", [] { return blocking([] { return gyre::local_rank(); }); });
  m.def("local_size", [] { return blocking([] { return gyre::local_size(); }); });
  m.def("cross_rank", [] { return blocking([] { return gyre::cross_rank(); }); });
  m.def("cross_size", [] { return blocking([] { return gyre::cross_size(); }); });
  // Horovod's mpi_threads_supported(): the thread level MPI was initialised
  // with (by gyre or by the job), asked of MPI directly: nothing in the
  // runtime depends on it, so the runtime does not carry it.
  m.def("mpi_threads_supported", [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) throw gyre::StateError("mpi_threads_supported(): MPI is not initialised");
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    return provided == MPI_THREAD_MULTIPLE;
  });
  // Which MPI gyre was built against (gyre.bootstrap: only an MPICH-family
  // MPI starts from a PMI-1 server). MPI allows it before MPI_Init.
  m.def("mpi_library_version", [] {
    char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    MPI_Get_library_version(text, &len);
    return std::string(text, static_cast<std::size_t>(len));
  });
  // The blocking calls wait as synchronize() does (PendingOp::wait): in
  // slices, so that Ctrl-C raises KeyboardInterrupt at once; the operation
  // stays in flight.
  m.def(
      "barrier",
      [](int ps) {
        drain_graveyard();
        PendingOp::start({}, [ps] { return gyre::barrier_async(ps); })->wait();
      },
      py::arg("process_set") = 0);
  m.def(
      "join",
      [](int ps) {
        drain_graveyard();
        auto op = PendingOp::start({}, [ps] { return gyre::join_async(ps); });
        op->wait();
        const int last = op->handle().join_last_rank();
        if (ps == 0 || last < 0) return last;
        return gyre::process_set_ranks(ps).at(static_cast<std::size_t>(last));
      },
      py::arg("process_set") = 0);
  // Process sets: add/remove are collective over every rank (they block).
  m.def("add_process_set",
        [](const std::vector<int>& ranks) {
          return blocking([&] { return gyre::add_process_set(ranks); });
        },
        py::arg("ranks"));
  m.def("add_process_set_of_members",
        [](const std::vector<int>& ranks, double timeout_s) {
          return blocking([&] { return gyre::add_process_set_of_members(ranks, timeout_s); });
        },
        py::arg("ranks"), py::arg("timeout_s") = 0.0);
  m.def("remove_process_set",
        [](int ps) { blocking([ps] { gyre::remove_process_set(ps); }); }, py::arg("process_set"));
  m.def("process_set_ids", [] { return gyre::process_set_ids(); });
  py::class_<BackgroundCopy, std::shared_ptr<BackgroundCopy>>(m, "BackgroundCopy")
      .def(py::init<std::vector<BackgroundCopy::Item>>())
      .def("wait", &BackgroundCopy::wait, py::call_guard<py::gil_scoped_release>());
  m.def("process_set_ranks", [](int ps) { return gyre::process_set_ranks(ps); });
  m.def("process_set_rank", [](int ps) { return gyre::process_set_rank(ps); });
  m.def("process_set_size", [](int ps) { return gyre::process_set_size(ps); });
  m.def("process_set_included", [](int ps) { return gyre::process_set_included(ps); });
  m.def("set_operation_timeout", &gyre::set_operation_timeout, py::arg("process_set"),
        py::arg("name_prefix"), py::arg("seconds"));
  m.def(
      "start_timeline",
      [](const std::string& path, bool mark_cycles) {
        blocking([&] { gyre::start_timeline(path, mark_cycles); });
      },
      py::arg("path"), py::arg("mark_cycles") = false);
  m.def("stop_timeline", [] { blocking([] { gyre::stop_timeline(); }); });
  m.def("elastic_supported", [] { return gyre::elastic_supported(); });
  m.def("elastic_enabled", [] { return gyre::elastic_enabled(); });
  // What a rank learns of the world it joins: a survivor after rebuild(),
  // or a replacement rank at its start (which has no lost ranks, attempts
  // or previous ranks of its own to report).
  auto world_dict = [](const gyre::RebuildInfo& r) {
    py::dict d;
    d["rank"] = r.rank;
    d["size"] = r.size;
    d["step"] = r.step;
    d["root"] = r.root;
    d["spawned"] = r.spawned;
    d["rebuilds"] = r.rebuilds;
    return d;
  };
  m.def("rebuild", [world_dict] {
    gyre::RebuildInfo r = blocking([] { return gyre::rebuild(); });
    py::dict d = world_dict(r);
    d["lost"] = r.lost;
    d["previous_ranks"] = r.previous_ranks;
    d["attempts"] = r.attempts;
    d["seconds"] = r.seconds;
    return d;
  });
  m.def("is_replacement", [] { return blocking([] { return gyre::is_replacement(); }); });
  m.def("replacement_info", [world_dict] {
    return world_dict(blocking([] { return gyre::replacement_info(); }));
  });
  m.def("set_respawn_command",
        [](const std::vector<std::string>& argv) { gyre::set_respawn_command(argv); });
  // The process's GYRE_* variables as the C library sees them: a
  // replacement rank receives the survivors' at init(), after Python took
  // its copy of the environment (os.environ).
  m.def("gyre_environment", [] {
    py::dict d;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const std::string entry(*e);
      const auto eq = entry.find('=');
      if (entry.rfind("GYRE_", 0) == 0 && eq != std::string::npos) {
        d[py::str(entry.substr(0, eq))] = entry.substr(eq + 1);
      }
    }
    return d;
  });
  bind_operations(m);
  bind_divergence(m);
  bind_shared_buffers(m);
}

// Data-parallel training of a small MLP written by hand, with gyre's C++ API.
//
//   mpirun -np 2 build/examples/gyre-train-mlp [epochs] [--local-sgd H [--diloco]]
//
// The model is 8 -> 32 (tanh) -> 1, trained with mini-batch SGD on a
// synthetic regression task generated here: y = sin(x . a) + 0.5 (x . b)^2
// / 8 + noise. Every rank generates its own shard from its own seed. Rank 0's
// initial weights are broadcast; each step, backward computes the output
// layer's gradients first and enqueues their allreduce at once
// (gyre::allreduce_async), then computes the hidden layer's while those are
// in flight, so communication overlaps computation as in Horovod. After the
// update the rank commits the step (version vectors). Rank 0 prints the
// loss averaged over all ranks per epoch; at the end the ranks check with
// fingerprints that they hold identical parameters.
//
// With --local-sgd H the gradients are not allreduced: each rank takes H
// steps alone, then gyre::LocalSgd averages the ranks' parameters (one
// grouped allreduce of θ_synced − θ_local) and commits the round; --diloco
// steps θ_synced with DiLoCo's outer optimizer (lr 0.7, Nesterov momentum
// 0.9) instead of plain averaging.
#include <gyre/gyre.h>
#include <gyre/local_sgd.h>
#include <gyre/view.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kIn = 8, kHidden = 32;
constexpr int kBatch = 32, kSamplesPerRank = 2048;
constexpr float kLearningRate = 0.05f;

// Parameters or their gradients: one buffer per tensor, each allreduced
// under its own name.
struct Mlp {
  std::vector<float> w1 = std::vector<float>(kHidden * kIn);  // [hidden][in]
  std::vector<float> b1 = std::vector<float>(kHidden);
  std::vector<float> w2 = std::vector<float>(kHidden);  // [1][hidden]
  std::vector<float> b2 = std::vector<float>(1);

  std::vector<std::pair<std::string, std::vector<float>*>> tensors() {
    return {{"w1", &w1}, {"b1", &b1}, {"w2", &w2}, {"b2", &b2}};
  }
};

struct Dataset {
  std::vector<float> x;  // [n][kIn]
  std::vector<float> y;  // [n]
};

Dataset make_shard(int rank) {
  // The target function is the same on every rank (seed 7); the samples differ.
  std::mt19937 fn_rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(kIn), b(kIn);
  for (auto& v : a) v = normal(fn_rng) * 0.5f;
  for (auto& v : b) v = normal(fn_rng) * 0.5f;

  std::mt19937 rng(1000 + rank);
  Dataset d;
  d.x.resize(kSamplesPerRank * kIn);
  d.y.resize(kSamplesPerRank);
  for (int i = 0; i < kSamplesPerRank; ++i) {
    float xa = 0, xb = 0;
    for (int k = 0; k < kIn; ++k) {
      const float v = normal(rng);
      d.x[i * kIn + k] = v;
      xa += v * a[k];
      xb += v * b[k];
    }
    d.y[i] = std::sin(xa) + 0.5f * xb * xb / 8.0f + 0.05f * normal(rng);
  }
  return d;
}

// One mini-batch: forward, backward with the allreduces enqueued as each
// layer's gradients are ready (unless `local`: local SGD, this rank's
// gradients alone), wait, SGD update. Returns the batch's loss.
float train_step(Mlp& model, Mlp& grad, const Dataset& data, int first, bool local) {
  std::vector<float> hidden(kBatch * kHidden), out(kBatch);
  float loss = 0;
  for (int i = 0; i < kBatch; ++i) {
    const float* x = &data.x[(first + i) * kIn];
    float o = model.b2[0];
    for (int h = 0; h < kHidden; ++h) {
      float z = model.b1[h];
      for (int k = 0; k < kIn; ++k) z += model.w1[h * kIn + k] * x[k];
      hidden[i * kHidden + h] = std::tanh(z);
      o += model.w2[h] * hidden[i * kHidden + h];
    }
    out[i] = o;
    const float err = o - data.y[first + i];
    loss += err * err / kBatch;
  }

  // Output layer first (backward order); its allreduces start at once.
  std::vector<float> dout(kBatch);
  for (auto* g : {&grad.w2, &grad.b2, &grad.w1, &grad.b1}) std::fill(g->begin(), g->end(), 0.0f);
  for (int i = 0; i < kBatch; ++i) {
    dout[i] = 2.0f * (out[i] - data.y[first + i]) / kBatch;
    grad.b2[0] += dout[i];
    for (int h = 0; h < kHidden; ++h) grad.w2[h] += dout[i] * hidden[i * kHidden + h];
  }
  // The same name every step: an operation's name must match across ranks,
  // and it may be reused once the previous operation with it has completed.
  std::vector<gyre::Handle> handles;
  if (!local) {
    handles.push_back(gyre::allreduce_async("grad.w2", gyre::view(grad.w2), gyre::view(grad.w2)));
    handles.push_back(gyre::allreduce_async("grad.b2", gyre::view(grad.b2), gyre::view(grad.b2)));
  }

  // Hidden layer, while the output layer's gradients are being reduced.
  for (int i = 0; i < kBatch; ++i) {
    const float* x = &data.x[(first + i) * kIn];
    for (int h = 0; h < kHidden; ++h) {
      const float a = hidden[i * kHidden + h];
      const float dz = dout[i] * model.w2[h] * (1.0f - a * a);
      grad.b1[h] += dz;
      for (int k = 0; k < kIn; ++k) grad.w1[h * kIn + k] += dz * x[k];
    }
  }
  if (!local) {
    handles.push_back(gyre::allreduce_async("grad.w1", gyre::view(grad.w1), gyre::view(grad.w1)));
    handles.push_back(gyre::allreduce_async("grad.b1", gyre::view(grad.b1), gyre::view(grad.b1)));
  }
  for (auto& h : handles) h.wait();  // Average over ranks (the default op)

  auto params = model.tensors();
  auto grads = grad.tensors();
  for (std::size_t t = 0; t < params.size(); ++t) {
    auto& p = *params[t].second;
    const auto& g = *grads[t].second;
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= kLearningRate * g[i];
  }
  if (!local) gyre::commit_step();  // under local SGD each outer round commits
  return loss;
}

}  // namespace

int main(int argc, char** argv) {
  int epochs = 10, period = 0;
  bool diloco = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--local-sgd") == 0 && i + 1 < argc) {
      period = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--diloco") == 0) {
      diloco = true;
    } else {
      epochs = std::atoi(argv[i]);
    }
  }
  try {
    gyre::init();
    const int rank = gyre::rank(), size = gyre::size();

    Mlp model, grad;
    std::mt19937 init_rng(99 + rank);  // different everywhere until the broadcast
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& w : model.w1) w = normal(init_rng) / std::sqrt(float(kIn));
    for (auto& w : model.w2) w = normal(init_rng) / std::sqrt(float(kHidden));
    std::unique_ptr<gyre::LocalSgd> local_sgd;
    if (period > 0) {  // LocalSgd's construction broadcasts rank 0's weights
      std::vector<gyre::TensorView> params;
      for (auto& [name, t] : model.tensors()) params.push_back(gyre::view(*t));
      gyre::LocalSgdOptions o{.period = period};
      if (diloco) o.outer = gyre::OuterOptimizer::diloco();
      local_sgd = std::make_unique<gyre::LocalSgd>(o, params);
    } else {
      std::vector<gyre::Handle> bcast;
      for (auto& [name, t] : model.tensors()) {
        bcast.push_back(gyre::broadcast_async("init." + name, gyre::view(*t), 0));
      }
      for (auto& h : bcast) h.wait();
    }

    const Dataset data = make_shard(rank);
    if (rank == 0) {
      std::printf("training an %d-%d-1 MLP on %d synthetic samples per rank, %d ranks", kIn,
                  kHidden, kSamplesPerRank, size);
      if (period > 0) {
        std::printf(", local SGD every %d steps (%s)", period, diloco ? "DiLoCo" : "averaging");
      }
      std::printf("\n");
    }
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      std::vector<float> epoch_loss{0.0f};
      const int batches = kSamplesPerRank / kBatch;
      for (int b = 0; b < batches; ++b) {
        const bool local = local_sgd != nullptr;
        epoch_loss[0] += train_step(model, grad, data, b * kBatch, local) / batches;
        if (local_sgd) local_sgd->step();
      }
      gyre::allreduce_async("epoch_loss", gyre::view(epoch_loss), gyre::view(epoch_loss)).wait();
      if (rank == 0) std::printf("epoch %d: loss %.4f\n", epoch, epoch_loss[0]);
    }

    // A last round unless the last step ran one: every rank ends with one model.
    if (local_sgd && local_sgd->local_steps() % period != 0) local_sgd->sync();
    std::vector<gyre::NamedBuffer> buffers;
    for (auto& [name, t] : model.tensors()) buffers.push_back({name, gyre::view(*t)});
    const auto mismatches = gyre::fingerprint_check(buffers);
    if (rank == 0) {
      std::printf(mismatches.empty() ? "parameters identical on every rank\n"
                                     : "parameters DIFFER across ranks\n");
    }
    gyre::shutdown();
    return mismatches.empty() ? 0 : 1;
  } catch (const gyre::Error& e) {
    std::fprintf(stderr, "gyre-train-mlp: %s\n", e.what());
    return 1;
  }
}

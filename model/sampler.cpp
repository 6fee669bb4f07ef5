// Batched generation (see sampler.h): the host only sets up, launches steps (or replays the
// captured one) and reads the done flags every read_every steps and the tokens at the end.
#include "model/sampler.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

namespace mod::model {

std::vector<Generation> generate_batch(const Transformer& model,
                                       const std::vector<std::vector<int64_t>>& prompts,
                                       int64_t max_new, const SamplingParams& params) {
  if (prompts.empty()) throw std::invalid_argument("sample: no prompts");
  if (max_new < 1)
    throw std::invalid_argument("sample: " + std::to_string(max_new) +
                                " new tokens; ask for at least 1");
  if (params.read_every < 1)
    throw std::invalid_argument("sample: read_every " + std::to_string(params.read_every) +
                                " must be at least 1");
  const int64_t max_len = model.config().seq_len();
  std::vector<int64_t> end, stop;
  for (const auto& prompt : prompts) {
    if (prompt.empty()) throw std::invalid_argument("sample: the prompt is empty");
    const int64_t n = static_cast<int64_t>(prompt.size());
    if (n >= max_len)
      throw std::invalid_argument("sample: prompt of " + std::to_string(n) +
                                  " tokens leaves no room in model.seq_len " +
                                  std::to_string(max_len));
    // The last token that fits is not fed: its logits would predict past the end.
    end.push_back(std::min(n + max_new, max_len));
    stop.push_back(end.back() - 1);
  }
  const int64_t length = *std::max_element(end.begin(), end.end());
  const int64_t steps = *std::max_element(stop.begin(), stop.end());
  DecodeState state = model.make_decode_state(prompts, stop, length, params.eot);
  SampleArgs args;
  args.temperature = params.temperature;
  args.top_k = params.top_k;
  args.top_p = params.top_p;
  args.seed = params.seed;
  args.first_stream = params.first_stream;
  const Device device = state.tokens.device();
  const bool graphed = params.cuda_graph && device == Device::CUDA;
  std::unique_ptr<CapturedWork> graph;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t q = 0; q < steps; ++q) {
    // The first step runs eagerly (it builds GEMM plans and fills the allocator's cache, which
    // a capture may not do); the second is captured, then replayed for every later one.
    if (!graphed || q == 0) {
      model.decode_batch_step(state, args);
    } else {
      if (!graph) {
        Backend& be = backend(device);
        be.begin_capture();
        try {
          model.decode_batch_step(state, args);
        } catch (...) {
          try {
            be.end_capture();
          } catch (...) {
          }
          throw;
        }
        graph = be.end_capture();
      }
      graph->replay();
    }
    if ((q + 1) % params.read_every == 0 && q + 1 < steps) {
      const Tensor active = state.active.to(Device::CPU);
      bool any = false;
      for (int64_t b = 0; b < state.batch; ++b) any = any || active.data<int64_t>()[b] != 0;
      if (!any) break;
    }
  }
  const Tensor tokens = state.tokens.to(Device::CPU);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<Tensor> lens;
  for (size_t blk = 0; blk < state.caches.size(); ++blk)
    if (model.routed(blk)) lens.push_back(state.caches[blk].len.to(Device::CPU));
  std::vector<Generation> out(prompts.size());
  for (int64_t b = 0; b < state.batch; ++b) {
    Generation& g = out[b];
    g.seconds = seconds;
    int64_t seen = stop[b];
    const int64_t* row = tokens.data<int64_t>() + b * length;
    for (int64_t p = static_cast<int64_t>(prompts[b].size()); p < end[b]; ++p) {
      if (row[p] == kNonFiniteLogitsToken)
        throw std::runtime_error(
            "sample: the logits of sequence " + std::to_string(b) + " held a NaN or an infinity "
            "at new token " + std::to_string(p - static_cast<int64_t>(prompts[b].size()) + 1) +
            " (position " + std::to_string(p) + "); it stopped there, nothing non-finite was "
            "sampled. The weights or activations overflowed: check the weights "
            "(modtrain inspect) or sample in f32");
      if (params.eot >= 0 && row[p] == params.eot) {
        seen = p;
        break;
      }
      g.tokens.push_back(row[p]);
    }
    for (const Tensor& len : lens) {
      g.admitted.push_back(len.data<int64_t>()[b]);
      g.seen.push_back(seen);
    }
  }
  return out;
}

Generation generate(const Transformer& model, const std::vector<int64_t>& prompt, int64_t max_new,
                    const SamplingParams& params) {
  return generate_batch(model, {prompt}, max_new, params).front();
}

}  // namespace mod::model

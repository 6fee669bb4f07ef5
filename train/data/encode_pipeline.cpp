// The ordered encoding pipeline (see encode_pipeline.h): one mutex and condition variable guard
// the queue of read batches, the map of encoded ones keyed by read order, and the flags.
#include "train/data/encode_pipeline.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace mod::data {

bool encode_in_order(TextSource& source, const Tokenizer& tok, std::optional<uint32_t> eot,
                     unsigned threads, size_t batch_bytes,
                     const std::function<bool(uint64_t)>& stop,
                     const std::function<void(const EncodedBatch&)>& consume) {
  const size_t max_in_flight = threads + 2;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<uint64_t, std::shared_ptr<EncodedBatch>>> todo;
  std::map<uint64_t, std::shared_ptr<EncodedBatch>> encoded;
  size_t in_flight = 0;
  uint64_t batches_read = 0;
  bool reader_done = false, abort = false, stopped = false;
  std::exception_ptr error;
  const auto set_error = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> l(mu);
    if (!error) error = e;
    abort = true;
    cv.notify_all();
  };

  std::vector<std::thread> pool;
  pool.emplace_back([&] {
    try {
      for (;;) {
        if (stop(batches_read)) {
          std::lock_guard<std::mutex> l(mu);
          stopped = true;
          break;
        }
        auto b = std::make_shared<EncodedBatch>();
        size_t bytes = 0;
        Document d;
        while (bytes < batch_bytes && source.next(d)) {
          bytes += d.text.size() + 1;
          b->docs.push_back(std::move(d));
        }
        if (b->docs.empty()) break;
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return in_flight < max_in_flight || abort; });
        if (abort) return;
        ++in_flight;
        todo.emplace_back(batches_read++, std::move(b));
        cv.notify_all();
      }
    } catch (...) {
      set_error(std::current_exception());
      return;
    }
    std::lock_guard<std::mutex> l(mu);
    reader_done = true;
    cv.notify_all();
  });
  for (unsigned w = 0; w < threads; ++w)
    pool.emplace_back([&] {
      try {
        for (;;) {
          std::pair<uint64_t, std::shared_ptr<EncodedBatch>> job;
          {
            std::unique_lock<std::mutex> l(mu);
            cv.wait(l, [&] { return !todo.empty() || reader_done || abort; });
            if (abort || todo.empty()) return;
            job = std::move(todo.front());
            todo.pop_front();
          }
          EncodedBatch& b = *job.second;
          for (auto& d : b.docs) {
            const std::vector<uint32_t> t = tok.encode(d.text);
            b.tokens.insert(b.tokens.end(), t.begin(), t.end());
            if (eot && d.eot_after) b.tokens.push_back(*eot);
            b.ends.push_back(b.tokens.size());
            b.text_bytes.push_back(d.text.size());
            std::string().swap(d.text);  // batches wait for the writer: hold only their tokens
          }
          b.tokens.shrink_to_fit();
          std::lock_guard<std::mutex> l(mu);
          encoded[job.first] = std::move(job.second);
          cv.notify_all();
        }
      } catch (...) {
        set_error(std::current_exception());
      }
    });

  try {
    for (uint64_t next = 0;; ++next) {
      std::shared_ptr<EncodedBatch> b;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] {
          return encoded.count(next) || error || ((reader_done || stopped) && batches_read == next);
        });
        if (error || !encoded.count(next)) break;
        b = std::move(encoded[next]);
        encoded.erase(next);
        --in_flight;
        cv.notify_all();
      }
      consume(*b);
    }
  } catch (...) {
    set_error(std::current_exception());
  }
  {
    std::lock_guard<std::mutex> l(mu);
    abort = abort || error;
  }
  cv.notify_all();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return stopped;
}

}  // namespace mod::data

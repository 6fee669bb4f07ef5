// The block scheduler: runs a block's fibers round-robin (or in a seeded random order), meets
// them at __syncthreads and at warp collectives, and turns every misuse into a Status naming
// kernel, block, threads and call sites instead of a hang. Rules enforced: sync.h and warp.h.
#include "block.h"

#include <stdexcept>
#include <utility>

#include "describe.h"

namespace emu::detail {
namespace {

thread_local Block* tls_block = nullptr;  // the block this host thread is running, if any

uint32_t bit(int lane) {
  return uint32_t{1} << lane;
}

// PTX ISA shfl.sync, with CUDA's c operand: segmask = 32 - width; up clamps at the segment's
// first lane, down/xor/idx at its last. A lane out of bounds reads its own value.
int source_lane(Collective kind, int lane, int arg, int width) {
  const int segmask = 32 - width, first = lane & segmask, last = first | (31 & ~segmask);
  const int b = arg & 31;
  switch (kind) {
    case Collective::kShflIdx:
      return first | (b & ~segmask);
    case Collective::kShflUp:
      return lane - b >= first ? lane - b : lane;
    case Collective::kShflDown:
      return lane + b <= last ? lane + b : lane;
    case Collective::kShflXor:
      return (lane ^ b) <= last ? lane ^ b : lane;
    default:
      return lane;
  }
}

Block& running_block(const char* what) {
  if (!tls_block || !tls_block->running())
    throw std::logic_error(std::string(what) + " called outside a kernel run by emu::launch");
  return *tls_block;
}

}  // namespace

bool same_site(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         (a.file_name() == b.file_name() || std::string_view(a.file_name()) == b.file_name());
}

Block& this_thread_block() {
  thread_local Block block;
  return block;
}

std::string Block::where() const {
  return std::string("kernel ") + setup_->kernel + ", block " + thread_text(blockIdx);
}

Status Block::run(const BlockSetup& setup) {
  setup_ = &setup;
  const dim3 d = setup.block_dim;
  n_ = static_cast<int>(d.x * d.y * d.z);
  threads_.resize(static_cast<size_t>(n_));
  warps_.assign(static_cast<size_t>((n_ + 31) / 32), WarpState{});
  for (WarpState& w : warps_) w.present = ~0u;
  if (n_ % 32) warps_.back().present = bit(n_ % 32) - 1;
  for (WarpState& w : warps_) w.exited = ~w.present;
  queue_.clear();
  head_ = 0;
  for (int i = 0; i < n_; ++i) {
    Thread& t = threads_[static_cast<size_t>(i)];
    t = Thread{};
    t.linear = i;
    t.idx = uint3{i % d.x, (i / d.x) % d.y, i / (d.x * d.y)};
    context_make(t.context, stacks_.get(static_cast<size_t>(i)), &Block::fiber_entry);
    push(i);
  }
  rng_ = Rng(setup.seed);
  exited_ = barrier_waiting_ = 0;
  failed_ = false;
  status_ = Status{};
  Block* const outer = tls_block;
  tls_block = this;

  const bool random = setup.options->random_schedule;
  while (!failed_) {
    if (head_ == queue_.size()) {
      queue_.clear();
      head_ = 0;
      if (!resolve_quiescence()) break;
      continue;
    }
    if (random) std::swap(queue_[head_], queue_[head_ + rng_.below(queue_.size() - head_)]);
    running_ = &threads_[static_cast<size_t>(queue_[head_++])];
    threadIdx = running_->idx;
    context_switch(scheduler_, running_->context);
    // A long-running block keeps the queue from growing without bound.
    if (head_ > 4096 && head_ * 2 > queue_.size()) {
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  running_ = nullptr;
  tls_block = outer;
  setup_ = nullptr;
  threadIdx = uint3{};
  return std::move(status_);
}

void Block::fiber_entry() {
  tls_block->thread_main();
}

void Block::thread_main() {
  // The message is taken out of the handler before failing: a fiber must not leave a catch
  // block by switching away, as the host thread's exception state is shared by its fibers.
  bool threw = false;
  std::string what;
  try {
    setup_->body.run(setup_->body.state);
  } catch (const std::exception& e) {
    threw = true;
    what = e.what();
  } catch (...) {
    threw = true;
    what = "an exception not derived from std::exception";
  }
  if (threw)
    fail(ErrorCode::kLaunchFailure, "thread " + thread_text(running_->idx) + " threw: " + what);
  exit_running();
}

void Block::suspend() {
  context_switch(running_->context, scheduler_);
}

void Block::fail(ErrorCode code, const std::string& message) {
  failed_ = true;
  status_ = Status{code, where() + ": " + message};
  context_switch(running_->context, scheduler_);
  __builtin_unreachable();  // a failed block's fibers are never resumed
}

void Block::exit_running() {
  Thread& t = *running_;
  const int w = t.linear / 32, l = t.linear % 32;
  t.wait = Wait::kExited;
  ++exited_;
  warps_[static_cast<size_t>(w)].exited |= bit(l);
  if (barrier_waiting_ > 0)
    fail(ErrorCode::kSynccheck,
         "thread " + thread_text(t.idx) + " exited while " + std::to_string(barrier_waiting_) +
             " threads wait at __syncthreads at " + site_text(barrier_site_) +
             " (the barrier needs every thread of the block: a __syncthreads in divergent code)");
  const WarpState& ws = warps_[static_cast<size_t>(w)];
  uint32_t waiting_for_it = 0;
  for (int j = 0; j < 32; ++j)
    if ((ws.waiting & bit(j)) && (lane(w, j).mask & bit(l))) waiting_for_it |= bit(j);
  if (waiting_for_it && !setup_->options->excuse_exited_lanes) {
    const Thread& u = lane(w, __builtin_ctz(waiting_for_it));
    fail(ErrorCode::kSynccheck,
         "lane " + std::to_string(l) + " (thread " + thread_text(t.idx) + ") exited while lanes " +
             lanes_text(waiting_for_it) + " of warp " + std::to_string(w) + " wait for it in " +
             collective_name(u.kind) + "(mask " + mask_text(u.mask) + ") at " + site_text(u.site));
  }
  for (int j = 0; j < 32; ++j)
    if ((waiting_for_it & bit(j)) && (ws.waiting & bit(j))) try_complete(w, lane(w, j).mask);
  context_switch(t.context, scheduler_);
  __builtin_unreachable();
}

uint64_t Block::collective(Collective kind, unsigned mask, uint64_t value, int arg, int width,
                           const std::source_location& site) {
  Thread& t = *running_;
  const int w = t.linear / 32, l = t.linear % 32;
  const WarpState& ws = warps_[static_cast<size_t>(w)];
  const auto call = [&] {  // formatted only on failure: this path runs per shuffle
    return std::string(collective_name(kind)) + "(mask " + mask_text(mask) + ") at " +
           site_text(site) + " in thread " + thread_text(t.idx) + " (warp " + std::to_string(w) +
           " lane " + std::to_string(l) + ")";
  };
  if (!(mask & bit(l)))
    fail(ErrorCode::kSynccheck, call() + ": the mask does not name the calling lane");
  if (width < 1 || width > 32 || (width & (width - 1)))
    fail(ErrorCode::kSynccheck,
         call() + ": width " + std::to_string(width) + " is not a power of two up to 32");
  if (!setup_->options->excuse_exited_lanes) {
    if (const uint32_t absent = mask & ~ws.present)
      fail(ErrorCode::kSynccheck, call() + ": the mask names lanes " + lanes_text(absent) +
                                      ", which the block does not have (" + std::to_string(n_) +
                                      " threads)");
    if (const uint32_t gone = mask & ws.exited)
      fail(ErrorCode::kSynccheck,
           call() + ": the mask names lanes " + lanes_text(gone) + ", which exited");
  }
  t.kind = kind;
  t.mask = mask;
  t.value = value;
  t.arg = arg;
  t.width = width;
  t.site = site;
  t.wait = Wait::kWarp;
  warps_[static_cast<size_t>(w)].waiting |= bit(l);
  try_complete(w, mask);
  suspend();
  return t.result;
}

void Block::try_complete(int w, unsigned mask) {
  WarpState& ws = warps_[static_cast<size_t>(w)];
  const uint32_t arrived = ws.waiting & mask;
  const uint32_t excused = setup_->options->excuse_exited_lanes ? ws.exited & mask : 0;
  if ((arrived | excused) != mask || arrived == 0) return;
  const Thread& first = lane(w, __builtin_ctz(arrived));
  for (int j = 0; j < 32; ++j) {
    if (!(arrived & bit(j))) continue;
    const Thread& u = lane(w, j);
    if (u.mask != mask || u.kind != first.kind) return;  // a lane waits in another call
    if (u.width != first.width)
      fail(ErrorCode::kSynccheck, "lanes of warp " + std::to_string(w) + " meet in " +
                                      collective_name(u.kind) + " at " + site_text(u.site) +
                                      " with widths " + std::to_string(first.width) + " and " +
                                      std::to_string(u.width));
  }
  uint32_t votes = 0;
  for (int j = 0; j < 32; ++j)
    if ((arrived & bit(j)) && lane(w, j).value) votes |= bit(j);
  for (int j = 0; j < 32; ++j) {
    if (!(arrived & bit(j))) continue;
    Thread& u = lane(w, j);
    switch (u.kind) {
      case Collective::kSyncwarp:
        u.result = 0;
        break;
      case Collective::kBallot:
        u.result = votes;
        break;
      case Collective::kAny:
        u.result = votes != 0;
        break;
      case Collective::kAll:
        u.result = votes == arrived;
        break;
      default: {
        const int src = source_lane(u.kind, j, u.arg, u.width);
        // A source outside the mask (or exited) is undefined in the Guide: poison.
        u.result = (arrived & bit(src)) ? lane(w, src).value : ~uint64_t{0};
      }
    }
  }
  for (int j = 0; j < 32; ++j) {
    if (!(arrived & bit(j))) continue;
    Thread& u = lane(w, j);
    u.wait = Wait::kReady;
    push(u.linear);
  }
  ws.waiting &= ~arrived;
}

int Block::barrier(BarrierOp op, int predicate, const std::source_location& site) {
  Thread& t = *running_;
  const auto call = [&] {
    return "__syncthreads at " + site_text(site) + " in thread " + thread_text(t.idx);
  };
  if (exited_ > 0) {
    std::vector<int> gone;
    for (const Thread& u : threads_)
      if (u.wait == Wait::kExited) gone.push_back(u.linear);
    fail(ErrorCode::kSynccheck, call() + ": threads " + threads_text(*this, gone) +
                                    " exited before it (the barrier needs every thread of the "
                                    "block: a __syncthreads in divergent code)");
  }
  if (barrier_waiting_ == 0) {
    barrier_site_ = site;
    barrier_true_ = 0;
  } else if (!same_site(site, barrier_site_)) {
    fail(ErrorCode::kSynccheck, call() + " while " + std::to_string(barrier_waiting_) +
                                    " threads wait at __syncthreads at " +
                                    site_text(barrier_site_) +
                                    " (divergent code reaches different barriers)");
  }
  t.site = site;
  t.wait = Wait::kBarrier;
  ++barrier_waiting_;
  barrier_true_ += predicate != 0;
  if (barrier_waiting_ == n_) {
    int result = 0;
    switch (op) {
      case BarrierOp::kSync:
        break;
      case BarrierOp::kCount:
        result = barrier_true_;
        break;
      case BarrierOp::kAnd:
        result = barrier_true_ == n_;
        break;
      case BarrierOp::kOr:
        result = barrier_true_ > 0;
        break;
    }
    for (Thread& u : threads_) {
      u.wait = Wait::kReady;
      u.result = static_cast<uint64_t>(result);
      push(u.linear);
    }
    barrier_waiting_ = 0;
  }
  suspend();
  return static_cast<int>(t.result);
}

unsigned Block::active_mask(const std::source_location& site) {
  Thread& t = *running_;
  t.site = site;
  t.wait = Wait::kActiveMask;
  suspend();
  return static_cast<unsigned>(t.result);
}

void Block::atomic_point() {
  const Options& o = *setup_->options;
  if (!o.random_schedule || !o.yield_at_atomics) return;
  push(running_->linear);
  suspend();
}

// No fiber can run. Lanes in __activemask learn who waits there with them; otherwise the block
// is done, or deadlocked.
bool Block::resolve_quiescence() {
  bool released = false;
  for (size_t w = 0; w < warps_.size(); ++w) {
    uint32_t pending = 0;
    for (int j = 0; j < 32 && w * 32 + static_cast<size_t>(j) < threads_.size(); ++j)
      if (lane(static_cast<int>(w), j).wait == Wait::kActiveMask) pending |= bit(j);
    while (pending) {
      const Thread& first = lane(static_cast<int>(w), __builtin_ctz(pending));
      uint32_t group = 0;
      for (int j = 0; j < 32; ++j)
        if ((pending & bit(j)) && same_site(lane(static_cast<int>(w), j).site, first.site))
          group |= bit(j);
      for (int j = 0; j < 32; ++j) {
        if (!(group & bit(j))) continue;
        Thread& u = lane(static_cast<int>(w), j);
        u.result = group;
        u.wait = Wait::kReady;
        push(u.linear);
      }
      pending &= ~group;
      released = true;
    }
  }
  if (released || exited_ == n_) return released;
  failed_ = true;
  status_ = Status{ErrorCode::kSynccheck, where() + ": " + deadlock_report(*this)};
  return false;
}

uint64_t warp_collective(Collective kind, unsigned mask, uint64_t value, int arg, int width,
                         const std::source_location& site) {
  return running_block(collective_name(kind)).collective(kind, mask, value, arg, width, site);
}

int block_barrier(BarrierOp op, int predicate, const std::source_location& site) {
  return running_block("__syncthreads").barrier(op, predicate, site);
}

unsigned active_mask(const std::source_location& site) {
  return running_block("__activemask").active_mask(site);
}

void atomic_point() {
  if (tls_block && tls_block->running()) tls_block->atomic_point();
}

void trap(const std::source_location& site) {
  running_block("__trap").fail(
      ErrorCode::kLaunchFailure,
      "thread " + thread_text(threadIdx) + " called __trap() at " + site_text(site));
}

}  // namespace emu::detail

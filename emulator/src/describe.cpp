// Error-message text. A deadlock report lists every group of waiting threads with its call
// site and, for a warp collective, what each named lane that did not come is doing instead.
#include "describe.h"

#include <cstdio>
#include <map>
#include <tuple>

#include "block.h"

namespace emu::detail {

std::string site_text(const std::source_location& site) {
  return std::string(site.file_name()) + ":" + std::to_string(site.line()) + " (" +
         site.function_name() + ")";
}

std::string lanes_text(uint32_t lanes) {
  std::string out;
  for (int j = 0; j < 32;) {
    if (!(lanes >> j & 1u)) {
      ++j;
      continue;
    }
    int end = j;
    while (end + 1 < 32 && (lanes >> (end + 1) & 1u)) ++end;
    if (!out.empty()) out += ",";
    out += std::to_string(j);
    if (end > j) out += '-' + std::to_string(end);
    j = end + 1;
  }
  return out.empty() ? "none" : out;
}

std::string mask_text(unsigned mask) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", mask);
  return buf;
}

std::string thread_text(uint3 idx) {
  // Appends only: GCC 12 at -O3 warns (-Wrestrict, falsely) on "literal" + std::string.
  std::string out = "(";
  out += std::to_string(idx.x) + ',' + std::to_string(idx.y) + ',' + std::to_string(idx.z) + ')';
  return out;
}

std::string threads_text(const Block& block, const std::vector<int>& linear) {
  constexpr size_t kMaxRanges = 8;
  const auto& threads = block.threads();
  std::string out;
  size_t ranges = 0, i = 0;
  while (i < linear.size()) {
    size_t end = i;
    while (end + 1 < linear.size() && linear[end + 1] == linear[end] + 1) ++end;
    if (ranges++ == kMaxRanges) {
      out += " and " + std::to_string(linear.size() - i) + " more";
      break;
    }
    if (!out.empty()) out += ", ";
    out += thread_text(threads[static_cast<size_t>(linear[i])].idx);
    if (end > i) out += '-' + thread_text(threads[static_cast<size_t>(linear[end])].idx);
    i = end + 1;
  }
  return out;
}

const char* collective_name(Collective kind) {
  switch (kind) {
    case Collective::kSyncwarp:
      return "__syncwarp";
    case Collective::kShflIdx:
      return "__shfl_sync";
    case Collective::kShflUp:
      return "__shfl_up_sync";
    case Collective::kShflDown:
      return "__shfl_down_sync";
    case Collective::kShflXor:
      return "__shfl_xor_sync";
    case Collective::kBallot:
      return "__ballot_sync";
    case Collective::kAny:
      return "__any_sync";
    case Collective::kAll:
      return "__all_sync";
  }
  return "a warp collective";
}

namespace {

std::string doing(const Thread& t) {
  switch (t.wait) {
    case Wait::kExited:
      return "exited";
    case Wait::kBarrier:
      return "waits at __syncthreads at " + site_text(t.site);
    case Wait::kActiveMask:
      return "waits in __activemask at " + site_text(t.site);
    case Wait::kWarp:
      return std::string("waits in ") + collective_name(t.kind) + "(mask " + mask_text(t.mask) +
             ") at " + site_text(t.site);
    case Wait::kReady:
      break;
  }
  return "is runnable";
}

}  // namespace

std::string deadlock_report(const Block& block) {
  constexpr int kMaxGroups = 6;
  const auto& threads = block.threads();
  std::string out = "deadlock, no thread can run";
  std::vector<int> at_barrier, exited;
  for (const Thread& t : threads) {
    if (t.wait == Wait::kBarrier) at_barrier.push_back(t.linear);
    if (t.wait == Wait::kExited) exited.push_back(t.linear);
  }
  if (!at_barrier.empty())
    out += "; threads " + threads_text(block, at_barrier) + " wait at __syncthreads at " +
           site_text(threads[static_cast<size_t>(at_barrier[0])].site) + ", which needs all " +
           std::to_string(block.size()) + " threads of the block";
  int groups = 0;
  const auto& warps = block.warps();
  for (size_t w = 0; w < warps.size(); ++w) {
    // Lanes waiting in the same call (kind, mask, site) form one group.
    std::map<std::tuple<int, unsigned, unsigned, unsigned>, uint32_t> calls;
    for (int j = 0; j < 32; ++j) {
      if (!(warps[w].waiting >> j & 1u)) continue;
      const Thread& t = threads[w * 32 + static_cast<size_t>(j)];
      calls[{static_cast<int>(t.kind), t.mask, t.site.line(), t.site.column()}] |= 1u << j;
    }
    for (const auto& [key, lanes] : calls) {
      if (groups++ == kMaxGroups) {
        out += "; and more";
        return out;
      }
      const Thread& first = threads[w * 32 + static_cast<size_t>(__builtin_ctz(lanes))];
      out += "; warp " + std::to_string(w) + " lanes " + lanes_text(lanes) + " wait in " +
             collective_name(first.kind) + "(mask " + mask_text(first.mask) + ") at " +
             site_text(first.site) + " for";
      const uint32_t missing = first.mask & ~lanes;
      std::string sep = " ";
      int listed = 0;
      for (int j = 0; j < 32; ++j) {
        if (!(missing >> j & 1u)) continue;
        if (listed++ == 4) {
          out += " and " + std::to_string(__builtin_popcount(missing >> j)) + " more lanes";
          break;
        }
        const size_t at = w * 32 + static_cast<size_t>(j);
        out += sep + "lane " + std::to_string(j) +
               (at < threads.size()
                    ? " (thread " + thread_text(threads[at].idx) + "), which " + doing(threads[at])
                    : ", which the block does not have");
        sep = "; ";
      }
    }
  }
  if (!exited.empty()) out += "; threads " + threads_text(block, exited) + " exited";
  return out;
}

}  // namespace emu::detail

// Summing a device trace by kernel (kernel_profile.h).
#include "train/metrics/kernel_profile.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

namespace mod::train {

namespace {

std::string demangle(const std::string& name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : name;
}

// Position of the '(' that opens the trailing parameter list, or npos.
size_t parameter_list(const std::string& s) {
  if (s.empty() || s.back() != ')') return std::string::npos;
  int depth = 0;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == ')') ++depth;
    if (s[i] == '(' && --depth == 0) return i;
  }
  return std::string::npos;
}

using Interval = std::pair<uint64_t, uint64_t>;

// Disjoint, sorted intervals covering exactly what `in` covers.
std::vector<Interval> merged(std::vector<Interval> in) {
  std::sort(in.begin(), in.end());
  std::vector<Interval> out;
  for (const Interval& i : in) {
    if (!out.empty() && i.first <= out.back().second)
      out.back().second = std::max(out.back().second, i.second);
    else
      out.push_back(i);
  }
  return out;
}

uint64_t length(const std::vector<Interval>& v) {
  uint64_t n = 0;
  for (const Interval& i : v) n += i.second - i.first;
  return n;
}

// The length of the intersection of two merged lists.
uint64_t overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  uint64_t n = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const uint64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) n += hi - lo;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return n;
}

}  // namespace

bool is_collective_kernel(const std::string& short_name) {
  return short_name.rfind("nccl", 0) == 0;
}

std::string short_kernel_name(const std::string& mangled) {
  // Neither mangled nor a signature: "[memcpy HtoD]", a CPU op ("gemm NT 2048x768x256"), an
  // extern "C" kernel. As is.
  if (mangled.rfind("_Z", 0) != 0 && mangled.find('(') == std::string::npos) return mangled;
  std::string s = demangle(mangled);
  if (const size_t p = parameter_list(s); p != std::string::npos && p > 0) s.resize(p);
  // Drop the return type and the qualifiers: keep what follows the last space or "::" that
  // sits outside template arguments and parentheses ("(anonymous namespace)").
  size_t begin = 0;
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<' || c == '(') ++depth;
    if (c == '>' || c == ')') --depth;
    if (depth != 0) continue;
    if (c == ' ') begin = i + 1;
    if (c == ':' && i + 1 < s.size() && s[i + 1] == ':') begin = i + 2;
  }
  return s.substr(begin);
}

KernelProfile summarize(const std::vector<DeviceActivity>& records, int64_t steps) {
  KernelProfile p;
  p.steps = std::max<int64_t>(1, steps);
  std::map<std::string, KernelRow> by_name;
  std::map<std::string, std::string> short_of;  // memo: demangling is slow
  std::vector<const std::string*> names;  // short name of each record, in record order
  names.reserve(records.size());
  for (const DeviceActivity& r : records) {
    auto [it, fresh] = short_of.try_emplace(r.name);
    if (fresh) it->second = short_kernel_name(r.name);
    names.push_back(&it->second);
    KernelRow& row = by_name[it->second];
    row.name = it->second;
    row.calls += 1;
    row.total_ms += static_cast<double>(r.end_ns - r.start_ns) / 1e6;
    row.flop += r.flop;
  }
  std::vector<size_t> order(records.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return records[a].start_ns < records[b].start_ns;
  });
  // The union of the intervals, merging overlaps; a hole in it is an idle gap.
  uint64_t open = 0, close = 0, busy = 0;
  const std::string* last_name = nullptr;
  for (size_t i : order) {
    const uint64_t s = records[i].start_ns, e = std::max(s, records[i].end_ns);
    if (last_name == nullptr || s > close) {
      if (last_name != nullptr) {
        busy += close - open;
        p.gaps.push_back({static_cast<double>(s - close) / 1e6, *last_name, *names[i]});
      }
      open = s;
      close = e;
      last_name = names[i];
    } else if (e > close) {
      close = e;
      last_name = names[i];
    }
  }
  busy += close - open;
  p.busy_ms = static_cast<double>(busy) / 1e6;
  std::vector<Interval> comm, compute;
  for (size_t i = 0; i < records.size(); ++i)
    (is_collective_kernel(*names[i]) ? comm : compute)
        .push_back({records[i].start_ns, std::max(records[i].start_ns, records[i].end_ns)});
  if (!comm.empty()) {
    comm = merged(std::move(comm));
    compute = merged(std::move(compute));
    p.comm_ms = static_cast<double>(length(comm)) / 1e6;
    p.compute_ms = static_cast<double>(length(compute)) / 1e6;
    p.overlap_ms = static_cast<double>(overlap(comm, compute)) / 1e6;
  }
  if (!order.empty()) p.span_ms = static_cast<double>(close - records[order.front()].start_ns) / 1e6;
  constexpr size_t kGaps = 8;
  std::sort(p.gaps.begin(), p.gaps.end(),
            [](const IdleGap& a, const IdleGap& b) { return a.ms > b.ms; });
  if (p.gaps.size() > kGaps) p.gaps.resize(kGaps);
  for (auto& [name, row] : by_name) p.rows.push_back(std::move(row));
  std::sort(p.rows.begin(), p.rows.end(), [](const KernelRow& a, const KernelRow& b) {
    return a.total_ms != b.total_ms ? a.total_ms > b.total_ms : a.name < b.name;
  });
  return p;
}

std::string format_profile(const KernelProfile& p, size_t top) {
  const double n = static_cast<double>(p.steps);
  int64_t launches = 0;
  for (const KernelRow& r : p.rows) launches += r.calls;
  const double wall = p.wall_ms > 0 ? p.wall_ms : p.span_ms;
  char line[512];
  std::string out;
  const double idle = wall > 0 ? 100.0 * std::max(0.0, 1.0 - p.busy_ms / wall) : 0.0;
  const char* plural = p.steps == 1 ? "" : "s";
  const char* header =
      p.cpu_ops ? "op profile over %lld step%s: the main thread in CPU ops %.2f ms of %.2f ms a "
                  "step (%.1f%% outside them), %.0f ops a step\n"
                : "kernel profile over %lld step%s: the device busy %.2f ms of %.2f ms a step "
                  "(%.1f%% idle), %.0f launches a step\n";
  std::snprintf(line, sizeof line, header, static_cast<long long>(p.steps), plural, p.busy_ms / n,
                wall / n, idle, static_cast<double>(launches) / n);
  out += line;
  // What the rows with a FLOP count (a CPU's GEMMs) reach together: with every other row free,
  // the step could run no faster than their rate.
  double counted_ms = 0, counted_flop = 0;
  for (const KernelRow& r : p.rows)
    if (r.flop > 0) counted_ms += r.total_ms, counted_flop += r.flop;
  if (counted_ms > 0 && p.busy_ms > 0) {
    const double rate = counted_flop / (counted_ms * 1e-3);
    std::snprintf(line, sizeof line,
                  "  those with a FLOP count (%s): %.1f%% of the time, at %.1f GFLOP/s together",
                  p.cpu_ops ? "GEMMs" : "known", 100.0 * counted_ms / p.busy_ms, rate / 1e9);
    out += line;
    if (p.sgemm_flops > 0) {
      std::snprintf(line, sizeof line, ", %.0f%% of a 1024^3 SGEMM timed after the window (%.1f)",
                    100.0 * rate / p.sgemm_flops, p.sgemm_flops / 1e9);
      out += line;
    }
    out += '\n';
  }
  if (p.comm_ms > 0) {
    std::snprintf(line, sizeof line,
                  "  collectives (nccl*) %.3f ms a step, %.1f%% of it under other kernels "
                  "(%.3f ms exposed); the other kernels had one in flight %.1f%% of their %.3f "
                  "ms\n",
                  p.comm_ms / n, 100.0 * p.overlap_ms / p.comm_ms,
                  (p.comm_ms - p.overlap_ms) / n,
                  p.compute_ms > 0 ? 100.0 * p.overlap_ms / p.compute_ms : 0.0,
                  p.compute_ms / n);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %6s %9s %8s %9s  %s\n", "share", "ms/step", "calls", "mean us",
                p.cpu_ops ? "op" : "kernel");
  out += line;
  for (size_t i = 0; i < std::min(top, p.rows.size()); ++i) {
    const KernelRow& r = p.rows[i];
    std::string name = r.name.size() > 90 ? r.name.substr(0, 87) + "..." : r.name;
    if (r.flop > 0 && r.total_ms > 0) {
      char rate[48];
      std::snprintf(rate, sizeof rate, "  %.1f GFLOP/s", r.flop / (r.total_ms * 1e6));
      name += rate;
    }
    std::snprintf(line, sizeof line, "  %5.1f%% %9.3f %8.0f %9.1f  %s\n",
                  p.busy_ms > 0 ? 100.0 * r.total_ms / p.busy_ms : 0.0, r.total_ms / n,
                  static_cast<double>(r.calls) / n, 1e3 * r.total_ms / static_cast<double>(r.calls),
                  name.c_str());
    out += line;
  }
  if (!p.gaps.empty()) out += "  longest idle gaps over the window:\n";
  for (const IdleGap& g : p.gaps) {
    auto cut = [](const std::string& s) { return s.size() > 50 ? s.substr(0, 47) + "..." : s; };
    std::snprintf(line, sizeof line, "  %9.3f ms after %s, before %s\n", g.ms, cut(g.after).c_str(),
                  cut(g.before).c_str());
    out += line;
  }
  return out;
}

void write_profile_csv(const KernelProfile& p, const std::string& path) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("kernel profile: cannot write " + path);
  // 9 significant digits: the shares of a profile add up to 1 to far better than 1e-6.
  f << std::setprecision(9) << "kernel,calls,total_ms,per_step_ms,mean_us,share,gflop_per_s\n";
  for (const KernelRow& r : p.rows) {
    std::string quoted = "\"";
    for (char c : r.name) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    quoted += '"';
    f << quoted << ',' << r.calls << ',' << r.total_ms << ','
      << r.total_ms / static_cast<double>(p.steps) << ','
      << 1e3 * r.total_ms / static_cast<double>(r.calls) << ','
      << (p.busy_ms > 0 ? r.total_ms / p.busy_ms : 0.0) << ',';
    if (r.flop > 0 && r.total_ms > 0) f << r.flop / (r.total_ms * 1e6);
    f << '\n';
  }
}

}  // namespace mod::train

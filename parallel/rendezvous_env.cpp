// Bootstrap choice and rendezvous options from the environment (see rendezvous_env.h).
#include "parallel/rendezvous_env.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "parallel/communicator.h"
#include "parallel/world.h"

namespace mod::parallel {

namespace {

const char* env(const char* var) {
  const char* v = std::getenv(var);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

int port_from(const char* var, const std::string& text) {
  size_t used = 0;
  long port = -1;
  try {
    port = std::stol(text, &used);
  } catch (const std::exception&) {
  }
  if (used != text.size() || port < 1 || port > 65535)
    throw std::invalid_argument("environment: " + std::string(var) + "='" + text +
                                "' is not a TCP port (1..65535)");
  return static_cast<int>(port);
}

double timeout_from_env() { return seconds_from_env("MOD_RENDEZVOUS_TIMEOUT_S", 300); }

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "unknown-host";
}

}  // namespace

Bootstrap parse_bootstrap(const std::string& text) {
  if (text == "auto") return {};
  if (text == "mpi") return {Bootstrap::Mpi, ""};
  if (text == "tcp") return {Bootstrap::Tcp, ""};
  if (text.rfind("file:", 0) == 0 && text.size() > 5) return {Bootstrap::File, text.substr(5)};
  throw std::invalid_argument("--rendezvous '" + text +
                              "': expected auto, mpi, tcp or file:DIR (a directory every rank "
                              "can read and rank 0 can write)");
}

Bootstrap resolve_bootstrap(const Bootstrap& choice, const LaunchInfo& info) {
  if (choice.method != Bootstrap::Auto) return choice;
  if (env("OMPI_COMM_WORLD_RANK") || env("PMIX_RANK") || env("PMI_RANK"))
    return {Bootstrap::Mpi, ""};
  return {info.size > 1 ? Bootstrap::Tcp : Bootstrap::Single, ""};
}

std::string describe(const Bootstrap& b) {
  switch (b.method) {
    case Bootstrap::Auto:
      return "auto";
    case Bootstrap::Single:
      return "single process";
    case Bootstrap::Mpi:
      return "mpi";
    case Bootstrap::Tcp:
      return "tcp";
    case Bootstrap::File:
      return "file:" + b.dir;
  }
  return "?";
}

std::string first_host_of_nodelist(const std::string& nodelist) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("Slurm node list '" + nodelist + "': " + why);
  };
  // The first entry ends at a comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    const char c = nodelist[end];
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) throw bad("a ']' without its '['");
    if (c == ',' && depth == 0) break;
  }
  if (depth != 0) throw bad("a '[' without its ']'");
  const std::string first = nodelist.substr(0, end);
  const size_t open = first.find('[');
  if (first.empty() || open == 0) throw bad("no host name before the first comma or '['");
  if (open == std::string::npos) return first;
  // prefix[a-b,c]suffix: the first range's lower end, zero padding kept ("01").
  const size_t close = first.find(']', open);
  std::string low = first.substr(open + 1);
  low = low.substr(0, low.find_first_of(",-]"));
  if (low.empty() || low.find_first_not_of("0123456789") != std::string::npos)
    throw bad("'" + first + "' has no number after '['");
  const std::string rest = first.substr(close + 1);  // "-ib[3-4]": another bracket, same rule
  return first.substr(0, open) + low +
         (rest.find('[') == std::string::npos ? rest : first_host_of_nodelist(rest));
}

RendezvousOptions rendezvous_options_from_env(const Bootstrap& bootstrap, const LaunchInfo& info) {
  if (bootstrap.method != Bootstrap::Tcp && bootstrap.method != Bootstrap::File)
    throw std::logic_error("rendezvous_options_from_env: not a tcp or file bootstrap");
  RendezvousOptions o;
  o.rank = info.rank;
  o.size = info.size;
  o.host = host_name();
  o.file_dir = bootstrap.dir;
  o.timeout_s = timeout_from_env();
  o.op_timeout_s = collective_timeout();
  const char* job = env("SLURM_JOB_ID");
  if (const char* addr = env("MASTER_ADDR")) {
    o.master_addr = addr;
    o.found_by = std::string("MASTER_ADDR=") + addr;
  } else if (bootstrap.method == Bootstrap::Tcp) {  // the file method publishes rank 0's host
    const char* var = env("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
    if (const char* list = env(var)) {
      o.master_addr = first_host_of_nodelist(list);
      o.found_by = std::string("the first host of ") + var + "=" + list;
    } else {
      throw std::invalid_argument(
          "rendezvous tcp: MASTER_ADDR is not set and there is no SLURM_STEP_NODELIST or "
          "SLURM_JOB_NODELIST to take rank 0's host from; set MASTER_ADDR to rank 0's host");
    }
  }
  if (const char* port = env("MASTER_PORT")) {
    o.master_port = port_from("MASTER_PORT", port);
    o.found_by += std::string(" MASTER_PORT=") + port;
  } else {
    o.master_port = job ? 20000 + static_cast<int>(std::strtoull(job, nullptr, 10) % 20000) : 29500;
    o.found_by += " port " + std::to_string(o.master_port) +
                  (job ? " (20000 + SLURM_JOB_ID % 20000; MASTER_PORT unset)"
                       : " (the default; MASTER_PORT unset)");
  }
  if (const char* token = env("MOD_RENDEZVOUS_TOKEN")) {
    o.token = token;
  } else if (job) {
    const char* step = env("SLURM_STEP_ID");
    const char* restart = env("SLURM_RESTART_COUNT");
    o.token = std::string("slurm-") + job + "." + (step ? step : "batch") + "." +
              (restart ? restart : "0");
  } else if (const char* run = env("TORCHELASTIC_RUN_ID")) {
    o.token = std::string("torchrun-") + run;
  } else if (bootstrap.method == Bootstrap::File) {
    throw std::invalid_argument(
        "rendezvous file: no job token to tell this job's file from an earlier one's; set "
        "MOD_RENDEZVOUS_TOKEN to the same fresh value on every rank (or run under Slurm)");
  }
  if (bootstrap.method == Bootstrap::File)
    o.found_by = "the file method in " + bootstrap.dir +
                 (o.master_addr.empty() ? "" : ", rank 0 published as " + o.master_addr);
  return o;
}

}  // namespace mod::parallel

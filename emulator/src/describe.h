// Text for the emulator's error messages: call sites, lane sets, thread ids, and the report of
// a deadlocked block (who waits where, for whom). Messages name threads as CUDA's threadIdx.
#pragma once

#include <cstdint>
#include <source_location>
#include <string>
#include <vector>

#include "emu/builtins.h"
#include "emu/scheduler.h"

namespace emu::detail {

class Block;

std::string site_text(const std::source_location& site);  // "file:line (function)"
std::string lanes_text(uint32_t lanes);                   // "0-4,6"
std::string mask_text(unsigned mask);                     // "0x0000ffff"
std::string thread_text(uint3 idx);                       // "(x,y,z)"
std::string threads_text(const Block& block, const std::vector<int>& linear);
const char* collective_name(Collective kind);
std::string deadlock_report(const Block& block);

}  // namespace emu::detail

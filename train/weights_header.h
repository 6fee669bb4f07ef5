// What a modtrain weights file's header must satisfy before a model is built from it: the format
// tag, a step number, an embedded config that passes config::validate (which bounds every model
// size), and exactly the tensors that config's model has, each with its shape. Reads headers
// only and allocates nothing from them, so the fuzz build runs it on hostile files.
#pragma once

#include <cstdint>
#include <string>

#include "configs/modtrain.pb.h"
#include "core/util/safetensors_header.h"

namespace mod::train {

inline constexpr const char* kWeightsFormat = "modtrain-weights-1";

struct WeightsHeader {
  modtrain::RunConfig config;
  int64_t step = 0;
};

// The "step" metadata value: plain decimal digits that fit int64, else an error naming path.
int64_t parse_weights_step(const std::string& text, const std::string& path);

// Checks a parsed header (format, step, config, every tensor's name and shape) and returns its
// config and step. Errors name the file and the field or tensor.
WeightsHeader check_weights_header(const SafetensorsIndex& index, const std::string& path);

// The step of the modtrain weights file at path, from its header alone; -1 when the file is
// missing, unreadable, or not a modtrain weights file with a step number. Never throws: grid
// status reads it for every run directory.
int64_t weights_step(const std::string& path);

}  // namespace mod::train

# mod_emulated_twin(<layer target> [PUBLIC <libs...>] [PRIVATE <libs...>]): <target>_emulated,
# the layer's objects as they are compiled for a GPU build, linked instead against the CUDA
# backend on the SIMT emulator (modtrain_core_emulated), the emulator's CUDA runtime and its NCCL
# stand-in. Nothing is compiled twice: a test linked against the twins runs the code a GPU user
# builds, with the hardware replaced (emulator/README.md, "Whole runs on the emulator").
function(mod_emulated_twin target)
  cmake_parse_arguments(ARG "" "" "PUBLIC;PRIVATE" ${ARGN})
  add_library(${target}_emulated STATIC $<TARGET_OBJECTS:${target}>)
  add_dependencies(${target}_emulated ${target})
  target_link_libraries(${target}_emulated PUBLIC ${ARG_PUBLIC} PRIVATE ${ARG_PRIVATE})
  foreach(property INTERFACE_INCLUDE_DIRECTORIES INTERFACE_COMPILE_DEFINITIONS)
    get_target_property(values ${target} ${property})
    if(values)
      set_property(TARGET ${target}_emulated APPEND PROPERTY ${property} ${values})
    endif()
  endforeach()
endfunction()

# Helpers for backend families (backends/<family>/CMakeLists.txt) and other
# CUDA targets. A new in-tree backend is its folder, one mlagate_add_backend()
# call there, an add_subdirectory() line in backends/CMakeLists.txt and its
# line in backends/registry.cpp.

# mlagate_cuda_target(<target> [ARCHITECTURES <archs>])
# C++20 for the target's CUDA sources, the project's architectures (sm_90a by
# default) or the given ones, and line info for profilers and the sanitizer.
function(mlagate_cuda_target target)
  cmake_parse_arguments(C "" "ARCHITECTURES" "" ${ARGN})
  if(NOT C_ARCHITECTURES)
    set(C_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
  endif()
  set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_ARCHITECTURES "${C_ARCHITECTURES}")
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
endfunction()

# mlagate_add_backend(<family> SOURCES <files>... [LINK <libs>...]
#                     [CUDA_ARCHITECTURES <archs>] [DEFINE <MLAGATE_HAS_X>])
# Builds mlagate_backend_<family> from SOURCES on the backend API (LINK: its
# private dependencies), links it into mlagate_backends (so the registry's line
# links), and with DEFINE makes <MLAGATE_HAS_X>=1 visible to the registry and
# the tests. Targets with .cu sources get mlagate_cuda_target().
function(mlagate_add_backend family)
  cmake_parse_arguments(B "" "CUDA_ARCHITECTURES;DEFINE" "SOURCES;LINK" ${ARGN})
  if(NOT B_SOURCES)
    message(FATAL_ERROR "mlagate_add_backend(${family}): no SOURCES")
  endif()
  set(target mlagate_backend_${family})
  add_library(${target} STATIC ${B_SOURCES})
  target_link_libraries(${target} PUBLIC mlagate_backend_api mlagate_cases PRIVATE ${B_LINK})
  list(FILTER B_SOURCES INCLUDE REGEX "\\.cu$")
  if(B_SOURCES)
    if(B_CUDA_ARCHITECTURES)
      mlagate_cuda_target(${target} ARCHITECTURES ${B_CUDA_ARCHITECTURES})
    else()
      mlagate_cuda_target(${target})
    endif()
  endif()
  target_link_libraries(mlagate_backends PUBLIC ${target})
  if(B_DEFINE)
    target_compile_definitions(mlagate_backends PUBLIC ${B_DEFINE}=1)
  endif()
endfunction()

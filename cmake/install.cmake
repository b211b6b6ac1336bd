# `cmake --install <build> --prefix <prefix>`: the mlagate executable, the
# plugin ABI header and the CMake package (find_package(mlagate): the
# mlagate::mlagate and mlagate::plugin targets, mlagate_add_gate()). Installs
# what the build has; nothing else needs to be built. backends/plugin/README.md,
# "Gate in your own ctest: find_package(mlagate)"; tested by Plugin.PackageGate.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MLAGATE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/mlagate" CACHE STRING
    "where the mlagate package config goes, relative to the prefix")
set(MLAGATE_INSTALL_BINDIR "${CMAKE_INSTALL_BINDIR}")
set(MLAGATE_INSTALL_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")

# The executable re-executes itself for its workers through /proc/self/exe
# (harness/cli/main.cpp), so it runs from any prefix; suites are compiled in.
# Libraries found outside the system directories (CUDA's runtime, a PyTorch
# libtorch) stay on its run path.
set_target_properties(mlagate PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS mlagate RUNTIME DESTINATION "${MLAGATE_INSTALL_BINDIR}")
# The libtorch reference module, loaded by the executable on first use from
# <bindir>/../lib/mlagate/ (reference/torch/torch_reference_loader.cpp).
if(TARGET mlagate_torch_reference_module)
  install(TARGETS mlagate_torch_reference_module LIBRARY DESTINATION "lib/mlagate")
endif()
# include/mlagate/: the plugin ABI (plugin.h, plain C, self-contained).
install(DIRECTORY "${CMAKE_CURRENT_LIST_DIR}/../include/mlagate" DESTINATION "${MLAGATE_INSTALL_INCLUDEDIR}"
        FILES_MATCHING PATTERN "*.h")

file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/../include/mlagate/plugin.h" _mlagate_abi
     REGEX "^#define MLAGATE_PLUGIN_ABI_VERSION ")
string(REGEX REPLACE ".*VERSION ([0-9]+).*" "\\1" MLAGATE_PLUGIN_ABI_VERSION "${_mlagate_abi}")
configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/mlagateConfig.cmake.in"
  "${CMAKE_BINARY_DIR}/package/mlagateConfig.cmake"
  INSTALL_DESTINATION "${MLAGATE_INSTALL_CMAKEDIR}"
  PATH_VARS MLAGATE_INSTALL_BINDIR MLAGATE_INSTALL_INCLUDEDIR)
# 0.x: any 0.y satisfies find_package(mlagate 0.x) for y >= x; the plugin ABI
# has its own version (MLAGATE_PLUGIN_ABI_VERSION), checked at load.
write_basic_package_version_file("${CMAKE_BINARY_DIR}/package/mlagateConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMajorVersion)
install(FILES "${CMAKE_BINARY_DIR}/package/mlagateConfig.cmake"
              "${CMAKE_BINARY_DIR}/package/mlagateConfigVersion.cmake"
              "${CMAKE_CURRENT_LIST_DIR}/mlagate_gate.cmake"
        DESTINATION "${MLAGATE_INSTALL_CMAKEDIR}")

# mlagate_add_gate(): mlagate's correctness gate as a test of your own ctest.
# Installed with mlagate's package config (lib/cmake/mlagate/) and included by
# find_package(mlagate); backends/plugin/README.md, "Gate in your own ctest".
#
#   find_package(mlagate REQUIRED)
#   add_library(my_mla MODULE my_mla.c)              # built against mlagate/plugin.h
#   target_link_libraries(my_mla PRIVATE mlagate::plugin)
#   enable_testing()
#   mlagate_add_gate(NAME my_mla.gate PLUGIN my_mla)
#
# mlagate_add_gate(NAME <test name>
#                  PLUGIN <target or absolute path>...     plugin libraries (--plugin), and/or
#                  EXEC <'CMD {in} {out}'> [EXEC_NAME <name>] [EXEC_CAPS <caps>] [EXEC_TIMEOUT <s>]
#                  [SUITE <suite or suite.yaml>]          default gate (the CI gate suite)
#                  [BACKEND <globs>]                      default: every backend of the plugin(s) / program
#                  [OP <ops>]                             --op, default mlagate's (layer)
#                  [POLICY <baseline|vllm|fixed>] [ATOL <x>] [RTOL <x>] [FUDGE <x>]
#                  [JUNIT <file>]                         relative: to the current binary dir
#                  [ARGS <more mlagate run arguments>...]
#                  [LABELS <labels>...]                   the label mlagate is always added
#                  [TIMEOUT <seconds>]                    ctest TIMEOUT, default 1800
#                  [WORKING_DIRECTORY <dir>])
#
# The test runs `mlagate run --plugin <file> --suite <suite> --backend <...>
# --no-progress ...` and passes only when mlagate exits 0: every record that ran
# passed and at least one ran (1 failures, 2 input error, 3 internal error,
# 4 nothing ran all fail the test). Without BACKEND, a plugin's backends are
# found when the test runs (`mlagate list backends` with and without the
# plugin; the in-tree backends are left out), so the gate never runs
# mlagate's own backends; an EXEC program alone is its EXEC_NAME (default
# exec.0). Arguments must not contain ';'.
#
# This file is also the script the tests run without BACKEND:
#   cmake -P mlagate_gate.cmake -- <mlagate> run <arguments without --backend>

if(CMAKE_SCRIPT_MODE_FILE AND CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  # ---- script mode: resolve the out-of-tree backends' names, then run the gate.
  set(_cmd "")
  set(_ot "")      # --plugin/--exec* pairs, for mlagate list backends
  set(_started FALSE)
  set(_take_next FALSE)
  math(EXPR _last "${CMAKE_ARGC} - 1")
  foreach(_i RANGE 0 ${_last})
    set(_a "${CMAKE_ARGV${_i}}")
    if(NOT _started)
      if(_a STREQUAL "--")
        set(_started TRUE)
      endif()
      continue()
    endif()
    string(REPLACE ";" "\\;" _a "${_a}")
    list(APPEND _cmd "${_a}")
    if(_take_next)
      list(APPEND _ot "${_a}")
      set(_take_next FALSE)
    elseif(_a MATCHES "^--(plugin|exec|exec-name|exec-caps|exec-timeout)$")
      list(APPEND _ot "${_a}")
      set(_take_next TRUE)
    endif()
  endforeach()
  list(LENGTH _cmd _n)
  if(_n LESS 2 OR NOT _ot)
    message(FATAL_ERROR "usage: cmake -P mlagate_gate.cmake -- <mlagate> run --plugin <lib> [arguments]")
  endif()
  list(GET _cmd 0 _mlagate)

  # Backend names: the non-indented lines of `mlagate list backends`, first word.
  function(_mlagate_gate_names out)
    execute_process(COMMAND "${_mlagate}" list backends ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE text
                    ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "mlagate_add_gate: `mlagate list backends` failed (exit ${rc}):\n${err}${text}")
    endif()
    string(REPLACE ";" "," text "${text}")
    string(REGEX REPLACE "\r?\n" ";" lines "${text}")
    set(names "")
    foreach(line IN LISTS lines)
      if(line MATCHES "^([^ \t]+)")
        list(APPEND names "${CMAKE_MATCH_1}")
      endif()
    endforeach()
    set(${out} "${names}" PARENT_SCOPE)
  endfunction()
  _mlagate_gate_names(_in_tree)
  _mlagate_gate_names(_all ${_ot})
  if(_in_tree)
    list(REMOVE_ITEM _all ${_in_tree})
  endif()
  if(NOT _all)
    message(FATAL_ERROR "mlagate_add_gate: the plugin adds no backend (${_ot})")
  endif()
  string(REPLACE ";" "," _backends "${_all}")
  list(APPEND _cmd --backend "${_backends}")

  set(_shown "")
  foreach(_a IN LISTS _cmd)
    if(_a MATCHES "[^A-Za-z0-9_./=:,+@%-]" OR _a STREQUAL "")
      string(REPLACE "'" "'\\''" _a "${_a}")
      set(_a "'${_a}'")
    endif()
    string(APPEND _shown " ${_a}")
  endforeach()
  message(STATUS "mlagate_add_gate: backends ${_backends}\n  ${_shown}")
  execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc)
  if(NOT _rc STREQUAL "0")
    if(_rc STREQUAL "1")
      set(_why "failures")
    elseif(_rc STREQUAL "2")
      set(_why "input error")
    elseif(_rc STREQUAL "3")
      set(_why "internal error")
    elseif(_rc STREQUAL "4")
      set(_why "nothing ran")
    else()
      set(_why "interrupted or killed")
    endif()
    message(FATAL_ERROR "mlagate_add_gate: mlagate exited ${_rc} (${_why})")
  endif()
  return()
endif()

# ---- included by mlagateConfig.cmake: the function.
set_property(GLOBAL PROPERTY MLAGATE_GATE_SCRIPT "${CMAKE_CURRENT_LIST_FILE}")

function(mlagate_add_gate)
  cmake_parse_arguments(PARSE_ARGV 0 G ""
    "NAME;SUITE;BACKEND;OP;POLICY;ATOL;RTOL;FUDGE;JUNIT;TIMEOUT;WORKING_DIRECTORY;EXEC;EXEC_NAME;EXEC_CAPS;EXEC_TIMEOUT"
    "PLUGIN;ARGS;LABELS;EXPECT")
  if(G_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "mlagate_add_gate: unknown arguments ${G_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT G_NAME)
    message(FATAL_ERROR "mlagate_add_gate: NAME is required")
  endif()
  if(NOT G_PLUGIN AND NOT G_EXEC)
    message(FATAL_ERROR "mlagate_add_gate(${G_NAME}): give PLUGIN <target or path> or EXEC <command>")
  endif()
  if(NOT G_EXEC AND (DEFINED G_EXEC_NAME OR DEFINED G_EXEC_CAPS OR DEFINED G_EXEC_TIMEOUT))
    message(FATAL_ERROR "mlagate_add_gate(${G_NAME}): EXEC_NAME, EXEC_CAPS and EXEC_TIMEOUT go with EXEC")
  endif()
  if(NOT TARGET mlagate::mlagate)
    message(FATAL_ERROR "mlagate_add_gate: no target mlagate::mlagate (call find_package(mlagate) first)")
  endif()
  if(NOT G_SUITE)
    set(G_SUITE gate)
  endif()
  if(NOT G_TIMEOUT)
    set(G_TIMEOUT 1800)
  endif()

  set(args run --suite "${G_SUITE}" --no-progress)
  foreach(p IN LISTS G_PLUGIN)
    if(TARGET "${p}")
      list(APPEND args --plugin "$<TARGET_FILE:${p}>")
    elseif(IS_ABSOLUTE "${p}" OR p MATCHES "^\\$<")  # a path, or a generator expression giving one
      list(APPEND args --plugin "${p}")
    else()
      message(FATAL_ERROR "mlagate_add_gate(${G_NAME}): PLUGIN ${p} is neither a target (declared before this call) "
                          "nor an absolute path (or a generator expression)")
    endif()
  endforeach()
  if(G_EXEC)
    string(REPLACE ";" "\\;" exec "${G_EXEC}")
    list(APPEND args --exec "${exec}")
    foreach(kw IN ITEMS EXEC_NAME EXEC_CAPS EXEC_TIMEOUT)
      if(DEFINED G_${kw})
        string(TOLOWER "${kw}" opt)
        string(REPLACE "_" "-" opt "${opt}")
        list(APPEND args "--${opt}" "${G_${kw}}")
      endif()
    endforeach()
  endif()
  foreach(kw IN ITEMS OP POLICY ATOL RTOL FUDGE)
    if(DEFINED G_${kw})
      string(TOLOWER "${kw}" opt)
      list(APPEND args "--${opt}" "${G_${kw}}")
    endif()
  endforeach()
  if(G_JUNIT)
    get_filename_component(junit "${G_JUNIT}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
    list(APPEND args --junit "${junit}")
  endif()
  # Expectations files (harness/verdicts/VERDICTS.md): known failures are XFAIL,
  # a strict entry that passes fails the test. Relative paths are the source dir's.
  foreach(e IN LISTS G_EXPECT)
    get_filename_component(e "${e}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    if(NOT EXISTS "${e}")
      message(FATAL_ERROR "mlagate_add_gate(${G_NAME}): EXPECT ${e} does not exist")
    endif()
    list(APPEND args --expect "${e}")
  endforeach()
  list(APPEND args ${G_ARGS})

  if(G_BACKEND OR NOT G_PLUGIN)
    # The backends are known: mlagate itself is the test.
    if(NOT G_BACKEND)
      if(DEFINED G_EXEC_NAME)
        set(G_BACKEND "${G_EXEC_NAME}")
      else()
        set(G_BACKEND exec.0)
      endif()
    endif()
    set(command "$<TARGET_FILE:mlagate::mlagate>" ${args} --backend "${G_BACKEND}")
  else()
    # A plugin's backends are read from the built library when the test runs.
    get_property(script GLOBAL PROPERTY MLAGATE_GATE_SCRIPT)
    set(command "${CMAKE_COMMAND}" -P "${script}" -- "$<TARGET_FILE:mlagate::mlagate>" ${args})
  endif()

  if(G_WORKING_DIRECTORY)
    add_test(NAME "${G_NAME}" COMMAND ${command} WORKING_DIRECTORY "${G_WORKING_DIRECTORY}")
  else()
    add_test(NAME "${G_NAME}" COMMAND ${command})
  endif()
  set(labels mlagate ${G_LABELS})
  set_tests_properties("${G_NAME}" PROPERTIES TIMEOUT "${G_TIMEOUT}" LABELS "${labels}")
endfunction()

# The suite files embedded into the binary: one list for the main build
# (cases/CMakeLists.txt) and the fuzz build (tests/fuzz/CMakeLists.txt).
# The includer sets MLAGATE_CASES_DIR to the cases/ folder first.
set(MLAGATE_SUITE_FILES
  ${MLAGATE_CASES_DIR}/specs.yaml
  ${MLAGATE_CASES_DIR}/suites/vllm.yaml
  ${MLAGATE_CASES_DIR}/suites/smoke.yaml
  ${MLAGATE_CASES_DIR}/suites/edges.yaml
  ${MLAGATE_CASES_DIR}/suites/fp8.yaml
  ${MLAGATE_CASES_DIR}/suites/sparse.yaml
  ${MLAGATE_CASES_DIR}/suites/v4.yaml
  ${MLAGATE_CASES_DIR}/suites/merge.yaml
  ${MLAGATE_CASES_DIR}/suites/layout.yaml
  ${MLAGATE_CASES_DIR}/suites/nope.yaml
  ${MLAGATE_CASES_DIR}/suites/gate.yaml)

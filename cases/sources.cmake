# The sources of mlagate_cases, one list for every build that compiles them:
# cases/CMakeLists.txt and the fuzz project (tests/fuzz/CMakeLists.txt), which
# compiles them itself with clang's instrumentation. MLAGATE_CASES_DIR must be set.
set(MLAGATE_CASES_SOURCES)
foreach(f op.cpp dtype.cpp encoding.cpp fp8.cpp tensor.cpp block_pool.cpp case_spec.cpp generator.cpp case.cpp paged_cache.cpp page_store.cpp
          sparse.cpp merge.cpp suite.cpp explore_space.cpp input_store.cpp process_slot.cpp remove_tree.cpp)
  list(APPEND MLAGATE_CASES_SOURCES ${MLAGATE_CASES_DIR}/${f})
endforeach()

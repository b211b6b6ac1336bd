// cases/generator.cpp built a second time without AVX-512, its namespace
// renamed mlagate_portable (tests/cases/CMakeLists.txt), so that
// Generator.NormalsAtIsNormalAtBitForBit checks normals_at's lane-at-a-time
// compaction too where the build itself takes the AVX-512 path.
#include "cases/generator.cpp"

// ServingFlags (serving_flags.h): the command line's serving-mode flags
// turned into the one mode they name, and written back as flags.
#include "harness/cli/serving_flags.h"

#include <algorithm>

#include <CLI/CLI.hpp>

#include "cases/errors.h"
#include "harness/run/serving.h"

namespace mlagate {

namespace {
bool has_batch_invariance(const std::vector<std::string>& checks) {
  return std::find(checks.begin(), checks.end(), "batch-invariance") != checks.end();
}
}  // namespace

void ServingFlags::add_options(CLI::App* app, bool of_failing_record) {
  auto help = [&](const char* run_text, const char* failing_text) { return of_failing_record ? failing_text : run_text; };
  app->add_flag("--cuda-graph", cuda_graph,
                help("CUDA-graph replay: the decode captured once per capture size with persistent buffers and "
                     "replayed for every case padded to it (padding seq_len 0 and 1); real rows judged, padding rows "
                     "must stay finite. Decode op; backends without capture are NOT_SUPPORTED",
                     "the failing record's mode: CUDA-graph replay (the capture size follows the requests)"));
  app->add_option("--capture-sizes", capture_sizes,
                  "--cuda-graph: capture sizes in requests, increasing (default vLLM's: 1,2,4,8,16,...,512)")
      ->delimiter(',');
  app->add_option("--check", checks,
                  help("batch-invariance: every request also runs alone, shuffled and beside extra requests; its rows "
                       "must be bitwise equal (BATCH_VARIANT otherwise; a failure only with --require). Decode op",
                       "batch-invariance: the failing record's mode"))
      ->delimiter(',')
      ->check(CLI::IsMember({"batch-invariance"}));
  app->add_option("--dcp", dcp,
                  help("decode context parallelism over N virtual ranks: each request's keys sharded as vLLM shards "
                       "them, the backend called per shard, the partials merged through their LSEs and compared. "
                       "Decode op",
                       "the failing record's DCP ranks"));
  app->add_option("--dcp-interleave", dcp_interleave, "--dcp: consecutive tokens per rank in turn")->capture_default_str();
  app->add_option("--steps", steps,
                  help("decode loops: each case becomes N decode steps, each writing its token with the backend's "
                       "cache_write, requests joining and finishing; every step checked. Decode op",
                       "the failing record's decode-loop steps"));
}

bool ServingFlags::given() const { return cuda_graph || !checks.empty() || dcp != 0 || steps != 0; }

ServingMode ServingFlags::mode() const {
  const bool batch_invariance = has_batch_invariance(checks);
  if ((cuda_graph ? 1 : 0) + (batch_invariance ? 1 : 0) + (dcp > 0 ? 1 : 0) + (steps > 0 ? 1 : 0) > 1)
    throw InputError("--cuda-graph, --check batch-invariance, --dcp and --steps are separate modes: give one of them");
  modes::CudaGraph graph;
  if (!capture_sizes.empty()) graph.capture_sizes = capture_sizes;
  graph.validate();
  const modes::Dcp sharded{dcp, dcp_interleave};
  if (dcp != 0) sharded.validate();
  if (dcp_interleave < 1) throw InputError("--dcp-interleave must be >= 1");
  if (dcp == 0 && dcp_interleave != 1) throw InputError("--dcp-interleave needs --dcp N");
  const modes::DecodeLoop loop{steps};
  if (steps != 0) loop.validate();
  if (cuda_graph) return graph;
  if (batch_invariance) return modes::BatchInvariance{};
  if (dcp > 0) return sharded;
  if (steps > 0) return loop;
  return {};
}

std::vector<std::string> ServingFlags::argv() const {
  std::vector<std::string> a;
  if (cuda_graph) a.push_back("--cuda-graph");
  if (!capture_sizes.empty()) {
    std::string sizes;
    for (int v : capture_sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(v);
    a.insert(a.end(), {"--capture-sizes", sizes});
  }
  for (const std::string& c : checks) a.insert(a.end(), {"--check", c});
  if (dcp != 0) a.insert(a.end(), {"--dcp", std::to_string(dcp)});
  if (dcp_interleave != 1) a.insert(a.end(), {"--dcp-interleave", std::to_string(dcp_interleave)});
  if (steps != 0) a.insert(a.end(), {"--steps", std::to_string(steps)});
  return a;
}

}  // namespace mlagate

// The layer op module (SPEC: Ops): the op composed from a backend's kernels
// as vLLM's MLAAttention does (run_layer), the glue cache its backends share
// (memo.h, owning the case's projected rows), the routing of requests to the
// decode and prefill paths (routing.h), and its err_baseline per path.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "cases/case.h"
#include "cases/paged_cache.h"
#include "harness/run/ops/driver.h"
#include "harness/run/ops/layer/memo.h"
#include "harness/run/ops/layer/routing.h"
#include "harness/run/ops/op_run.h"
#include "reference/kv_projection.h"

namespace mlagate {

struct CaseContext;

// Layer op. base_cache: the case's cache for the backend's block size, built
// with write_new_tokens = false (the backend's cache_write fills them).
// Throws NotSupportedError when the routing needs a kernel the backend lacks.
// memo (optional): glue shared with the other backends running this case.
OpRun run_layer(Backend& b, const Case& c, const PagedCache& base_cache, const ExecOptions& opt,
                LayerMemo* memo = nullptr);

// The case's own up-projected rows, owned by the layer module's state and
// shared with the prefill op and the baseline emulation; its time counts as
// input generation. projection(ctx, requests): those requests' rows held.
KvProjection& case_projection(CaseContext& ctx);
const KvProjection& case_projection(CaseContext& ctx, std::span<const int> requests);
// Every row's K and V, contiguous (the kernel-level prefill op's inputs).
std::pair<const Tensor*, const Tensor*> case_projection_of_all(CaseContext& ctx);
// A backend wrote into k (lent by case_projection_of_all): its rows are made again.
void withdraw_projection(CaseContext& ctx, const Tensor* k);

// The layer op's err_baseline on the given per-request paths; each
// (form, request) is computed once per case, whichever backend needs it.
BaselineErrors layer_baseline(CaseContext& ctx, const std::vector<std::string>& paths, const BaselineImpl& impl);
// With a device reference not computed yet: the reference on another thread
// while this one emulates the baseline (layer_state.cpp says how).
void overlap_reference_and_baseline(CaseContext& ctx, const std::vector<std::string>& paths,
                                    const BaselineImpl& impl);

}  // namespace mlagate

// The backend interface: what a kernel under test implements. A backend states
// its capabilities and answers supports() from the same function that selects
// its kernel, so "unsupported" has one source. Shapes are given at each entry.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cases/case_spec.h"
#include "cases/op.h"
#include "cases/paged_cache.h"
#include "cases/tensor.h"

namespace mlagate {


// How a backend's decode kernel accepts query lengths (vLLM's QueryLenSupport).
enum class QueryLenSupport : std::uint8_t { kSingleOnly, kUniform, kVarlen };
std::string_view query_len_support_name(QueryLenSupport q);

struct Support {
  bool ok = true;
  std::string reason;  // why not, in the kernel's own words ("block size 16 not in {64}")
  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
};

struct Capabilities {
  std::vector<Op> ops;                 // kernel-level ops implemented (decode, prefill, cache_write)
  std::vector<int> block_sizes;        // first is the preferred one ("bs=auto")
  QueryLenSupport query_len_support = QueryLenSupport::kSingleOnly;
  int reorder_threshold = 1;           // requests with q_len <= threshold are decodes
  std::vector<DType> dtypes;           // model dtypes
  std::vector<KvCacheDtype> kv_dtypes;  // cache dtypes the kernels read (and cache_write writes)
  // prefill() reads k and v where they are, host or CUDA device memory
  // (TensorView::on_device), and never writes them (device memory it may
  // still read on its own streams after returning). With the glue on the GPU
  // (--reference cuda) the layer op then lends the up-projected context as
  // device memory: no upload per backend and call (a TP 1 chunk is 1.3 GB).
  bool device_inputs = false;
  // Layouts (cases/LAYOUTS.md). decode() honours TensorView::strides of q_lat,
  // q_pe, o_lat and lse (the last dim contiguous), as vLLM hands them: q_lat
  // and q_pe slices of one fused tensor, outputs into larger buffers. The
  // harness hands strided views only to a backend that says so.
  bool strided_views = false;
  // The largest page pool the kernels address, in bytes from the pool's start
  // to the end of its last block: pool layouts past it are NOT_SUPPORTED. The
  // default is what signed 32-bit byte offsets reach.
  std::int64_t max_pool_bytes = std::int64_t{1} << 31;
  // sparse_decode reads a top-k row's valid slots as a prefix (FA3's seqused_k,
  // FlashInfer's planned lengths): the harness hands its rows with every slot
  // >= 0 first and -1 only as a tail, as vLLM's indexer emits them
  // (valid_first_rows in backends/sparse_convert.h; rows with topk_length are
  // handed as they are). Other backends get the -1s scattered through the row.
  bool sparse_valid_prefix = false;
  // Non-empty: the engine's backend refuses decode context parallelism, and
  // the --dcp mode is NOT_SUPPORTED with this reason (vLLM's own text).
  std::string no_dcp;
  // Runs on the host alone: no device, no context or allocator of its own
  // that workers side by side would each hold. `mlagate run --workers auto`
  // gives a run whose backends all say so a worker a core (at most 8).
  bool host_only = false;
};

// Run-wide settings handed to backend factories by the registry (CLI flags).
struct BackendOptions {
  int num_splits = 0;  // split-KV backends: 0 chooses from the work; N > 0 forces N splits (--splits)
};

// Kernel-level decode (absorbed MQA over the paged cache), SPEC: Ops.
struct DecodeArgs {
  TensorView q_lat;   // [T, N, L] model dtype (q_nope absorbed through W_UK)
  TensorView q_pe;    // [T, N, R] model dtype
  const PagedCache* cache = nullptr;       // block size = the backend's, for this run
  std::span<const std::int32_t> seq_lens;  // [B] keys visible to each request's last token
  std::span<const std::int32_t> query_start_loc;  // [B+1]
  std::span<const std::int32_t> block_table_rows; // [B] row of the cache's block table per request
  double scale = 0;     // softmax scale
  float k_scale = 1.f;  // fp8, fp8_e4m3 caches: x = e4m3 * k_scale (fp8_ds_mla ignores it)
  TensorView o_lat;     // out [T, N, L] model dtype
  TensorView lse;       // out [T, N] float32, natural log; -inf (or +inf) for rows with no key
};

// Kernel-level prefill: ordinary attention over contiguous varlen k/v with the
// bottom-right causal rule (query u of a request with q, k lengths sees keys
// 0 .. k - q + u).
struct PrefillArgs {
  TensorView q;  // [T, N, P+R] model dtype
  TensorView k;  // [Sk, N, P+R] model dtype
  TensorView v;  // [Sk, N, V] model dtype
  std::span<const std::int32_t> cu_seqlens_q;  // [B+1]
  std::span<const std::int32_t> cu_seqlens_k;  // [B+1]
  bool causal = true;  // false: every query sees every key (chunked context)
  double scale = 0;
  TensorView o;    // out [T, N, V] model dtype
  TensorView lse;  // out [T, N] float32
};

// Kernel-level sparse attention over paged caches (FlashMLA's sparse decode,
// flash_mla_with_kvcache with indices): DeepSeek V3.2 with per-token top-k
// rows, V4 with a sliding window plus a compressed cache. MQA in latent space:
// every head reads the same entries; a key is the whole entry [kv_c | k_pe]
// (dequantized), its value the first Dv elements. For token t and head h:
//   logit_j = scale * <q[t,h,:], key_j>   over the keys t names (duplicates count twice)
//   lse     = log sum_j exp(logit_j)      (the sink left out)
//   o[t,h]  = sum_j exp(logit_j - lse) value_j * 1 / (1 + exp(sink[h] - lse))
// A row with no key: o = 0 and lse = +inf (FlashMLA) or -inf, never NaN.
struct SparseDecodeArgs {
  TensorView q;                        // [T, N, L+R] model dtype: absorbed q_lat then q_pe
  const PagedCache* cache = nullptr;   // the main cache (block size = the backend's)
  TensorView indices;                  // V3.2: [T, K] int32 global slots of `cache`, -1 = none; V4: empty
  std::span<const std::int32_t> topk_length;  // [T] or empty: only the first topk_length[t] slots count
  // V4's sliding window: token t at position p of its request attends to the
  // keys max(0, p - window + 1) .. p of that request in `cache`, read through
  // the block table. The backend builds these slots (sparse_window_slots below
  // is the reference way). 0: no window (V3.2).
  int window = 0;
  std::span<const std::int32_t> seq_lens;          // [B]
  std::span<const std::int32_t> query_start_loc;   // [B+1]; p = seq_len - query_len + (t - query_start_loc)
  std::span<const std::int32_t> block_table_rows;  // [B]
  const PagedCache* extra_cache = nullptr;  // V4's compressed cache (nullptr: none)
  TensorView extra_indices;                 // [T, K2] int32 global slots of extra_cache, -1 = none
  std::span<const std::int32_t> extra_topk_length;  // [T] or empty
  std::span<const float> sink;  // [N] or empty: per-head attention sink (a logit with no value)
  double scale = 0;
  TensorView o;    // out [T, N, Dv] model dtype; Dv = L (V3.2) or L + R (V4: the value is the whole entry)
  TensorView lse;  // out [T, N] float32
};

// Kernel-level sparse prefill (FlashMLA's flash_mla_sparse_fwd): the same math
// over a flat array of dequantized model-dtype rows (vLLM gathers the cache into
// such a workspace); index k names row k, and -1 or k >= S_kv names none.
struct SparsePrefillArgs {
  TensorView q;        // [T, N, D] model dtype
  TensorView kv;       // [S_kv, D] model dtype (unused rows may hold NaN: never read them)
  TensorView indices;  // [T, K] int32
  std::span<const std::int32_t> topk_length;  // [T] or empty
  std::span<const float> sink;                // [N] or empty
  double scale = 0;
  TensorView o;    // out [T, N, Dv] model dtype, the value = the first Dv elements of a row
  TensorView lse;  // out [T, N] float32
};

// Kernel-level merge of two partial attention results of the same rows
// (vLLM's merge_attn_states; chunked prefill's context and new-token parts,
// cascade attention's shared prefix and suffix, DCP's shards), SPEC: Ops,
// merge_states. For row (t, h): an lse of +inf or -inf means that side saw no
// key (FA2 writes +inf) and has weight 0; with m = max of the finite lses,
//   output = (prefix * exp(lp - m) + suffix * exp(ls - m)) / (exp(lp - m) + exp(ls - m))
//   output_lse = m + log(exp(lp - m) + exp(ls - m))
// and a row empty on both sides gives output 0 and lse -inf (+inf accepted).
struct MergeStatesArgs {
  TensorView prefix_output;  // [T, N, D] bf16, fp16 or fp32
  TensorView prefix_lse;     // [T, N] float32
  TensorView suffix_output;  // [T, N, D] the prefix's dtype
  TensorView suffix_lse;     // [T, N] float32
  TensorView output;         // out [T, N, D] the inputs' dtype
  TensorView output_lse;     // out [T, N] float32
};

class DecodeBench;  // below: a prepared decode for `mlagate bench`
class DecodeGraph;  // below: a captured decode for `--cuda-graph`
class SparseDecodeGraph;  // below: a captured sparse decode for `--cuda-graph`

// One instance runs one call at a time (the runner is sequential); backends
// may keep workspaces between calls.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view description() const = 0;
  virtual Capabilities capabilities() const = 0;
  // (optional) defaults to checking capabilities(); override to add kernel rules.
  virtual Support supports(const CaseSpec& spec, Op op) const;
  // (optional) kernel-level ops; the defaults throw NotSupportedError.
  virtual void decode(const DecodeArgs& args);
  virtual void prefill(const PrefillArgs& args);
  virtual void sparse_decode(const SparseDecodeArgs& args);
  virtual void sparse_prefill(const SparsePrefillArgs& args);
  virtual void merge_states(const MergeStatesArgs& args);
  // (optional) writes new tokens into the cache in its format (cache.kv_dtype,
  // cache.k_scale, cache.scale_rule; layouts in cases/fp8.h); defaults to the
  // reference writer. List Op::kCacheWrite in capabilities().ops to have the
  // cache_write op check it byte for byte against the reference writer.
  // kv_c: [n, L], k_pe: [n, R] model dtype; slots [n], negative = skip.
  virtual void cache_write(PagedCache& cache, const TensorView& kv_c, const TensorView& k_pe,
                           std::span<const std::int64_t> slots);

  // (optional) benchmarking (`mlagate bench`): prepare a decode call once
  // (uploads, allocations, planning or scheduler metadata: everything outside
  // the timed region) and return a handle whose launch() enqueues only the
  // kernels of one decode on the given CUDA stream (a cudaStream_t passed as
  // void*), without synchronizing. The bench times launch() with CUDA events
  // and flushes L2 between iterations. nullptr (the default): the backend is not
  // benchmarkable. The handle may keep pointers into args' host data until it
  // is destroyed; outputs land in device buffers the handle owns.
  virtual std::unique_ptr<DecodeBench> prepare_decode_bench(const DecodeArgs& args);
  // (optional) the same for the sparse decode op (`mlagate bench` on cases
  // with top-k rows): everything the call needs made once, launch() enqueues
  // the kernels of one sparse decode. nullptr (the default): not benchmarkable.
  virtual std::unique_ptr<DecodeBench> prepare_sparse_decode_bench(const SparseDecodeArgs& args);

  // (optional) CUDA-graph mode (`--cuda-graph`, harness/run/SERVING.md): capture
  // one decode of `args` (a batch padded to a capture size) with persistent
  // inputs, outputs and metadata, as a serving engine captures it once per
  // batch size, and return the handle that replays it. nullptr (the default):
  // the backend cannot be captured (its records are NOT_SUPPORTED). Throws
  // NotSupportedError for a call it cannot capture. The handle may keep a
  // reference to this backend; it is destroyed before the backend.
  virtual std::unique_ptr<DecodeGraph> capture_decode(const DecodeArgs& args);
  // (optional) the same for the sparse decode op: capture one call of `args`
  // (index rows, window, compressed cache and sink of a padded batch) and
  // return the handle that replays it; nullptr (the default): not capturable.
  virtual std::unique_ptr<SparseDecodeGraph> capture_sparse_decode(const SparseDecodeArgs& args);
};

// A captured decode. replay() gets arguments of the captured shapes (the same
// numbers of requests and tokens, heads, dims, dtypes, kv dtype, block size,
// scale and k_scale; a cache of at most the captured number of blocks and
// table width): it refreshes the persistent inputs and metadata in place (the
// captured addresses), replays the captured work and copies the persistent
// outputs into args.o_lat and args.lse. Outputs are not reset between replays:
// what a replay does not write keeps what the last one left.
class DecodeGraph {
 public:
  virtual ~DecodeGraph() = default;
  virtual void replay(const DecodeArgs& args) = 0;
  virtual std::string note() const { return {}; }  // "CUDA graph", "host emulation", ...
};

// The host emulation of a captured decode, for backends that run on the host:
// persistent host buffers for every input, the cache and the outputs, refreshed
// in place on each replay, and the backend's decode() called on them (the same
// addresses every replay). What a graph changes for a kernel is exactly that.
std::unique_ptr<DecodeGraph> emulate_decode_graph(Backend& b, const DecodeArgs& args);

// The same persistent host arguments around any capture: `step(p, capture)`
// gets arguments of the captured shapes at the same addresses every time (the
// cache padded to the captured blocks, table rows to the captured width),
// first once with capture = true (the capture: its outputs are not reported),
// then once per replay; its outputs are copied out after each replay. Backends
// whose graphs live elsewhere (a plugin's CUDA graph, a Python torch graph)
// capture and replay in `step`.
using DecodeGraphStep = std::function<void(const DecodeArgs& persistent, bool capture)>;
std::unique_ptr<DecodeGraph> persistent_decode_graph(const DecodeArgs& args, DecodeGraphStep step, std::string note);

// A captured sparse decode, as DecodeGraph: replay() gets arguments of the
// captured shapes (tokens, heads, index widths, window, sink, scale, cache
// formats; caches of at most the captured blocks and table width), refreshes
// the persistent inputs in place, replays, and copies the persistent outputs
// into args.o and args.lse (never reset between replays).
class SparseDecodeGraph {
 public:
  virtual ~SparseDecodeGraph() = default;
  virtual void replay(const SparseDecodeArgs& args) = 0;
  virtual std::string note() const { return {}; }
};

// persistent_decode_graph's twin for the sparse op (backends/sparse_graph.cpp):
// `step` gets persistent host arguments of the captured shapes (both caches
// padded to the captured blocks and width), capture = true once, then once
// per replay.
using SparseDecodeGraphStep = std::function<void(const SparseDecodeArgs& persistent, bool capture)>;
std::unique_ptr<SparseDecodeGraph> persistent_sparse_decode_graph(const SparseDecodeArgs& args, SparseDecodeGraphStep step,
                                                                  std::string note);
// The host emulation: the backend's sparse_decode on the persistent buffers.
std::unique_ptr<SparseDecodeGraph> emulate_sparse_decode_graph(Backend& b, const SparseDecodeArgs& args);

// A cache of `c`'s format and capacity (num_blocks, table width) with `rows`
// block-table rows, its data and table zero; and `c` copied into such a cache
// in place (blocks at the front, each table row padded with block 0). Throws
// invalid_argument when `c` is of another format or larger. For the
// persistent buffers of captured graphs.
PagedCache persistent_cache_like(const PagedCache& c, std::int64_t rows);
void refresh_persistent_cache(const PagedCache& c, PagedCache& into);

class DecodeBench {
 public:
  virtual ~DecodeBench() = default;
  virtual void launch(void* cuda_stream) = 0;
  // What the timed region holds where it is worth saying ("" = the kernels
  // alone): "includes a copy of the cache into the library's layout", or
  // which kernels a captured graph replays ("decode + combine kernels, ...").
  virtual std::string note() const { return {}; }
};

// The argument checks every decode kernel needs before it reads anything, in
// one place for the CPU, CUDA and kernel-library backends: ranks, the shared
// 16-bit model dtype and the shapes of q_lat, q_pe, o_lat and lse, the cache's
// L and R against the queries', query_start_loc, the block-table rows, seq_lens
// against the table width, and every block id a request reads within
// [0, num_blocks). Throws std::invalid_argument ("decode: ..."), and
// std::out_of_range for a block id, so a bad id fails on the host and never
// inside a kernel (a device fault would poison the CUDA context).
void check_decode_args(const DecodeArgs& a);

// The same for the sparse ops: shapes and dtypes, and every slot a token may
// read (-1 or within the cache; topk_length within [0, K]); throws
// std::invalid_argument ("sparse_decode: ...") or std::out_of_range.
void check_sparse_decode_args(const SparseDecodeArgs& a);
void check_sparse_prefill_args(const SparsePrefillArgs& a);
// The same for merge_states: ranks, shapes, one output dtype of bf16, fp16 or
// fp32 for both inputs and the output, float32 lses, data present; throws
// std::invalid_argument ("merge_states: ...").
void check_merge_states_args(const MergeStatesArgs& a);
// What a merge_states backend declares: the op alone, bf16/fp16/fp32 outputs
// (a merge reads no cache: the block size and kv dtype are placeholders).
Capabilities merge_states_capabilities();
// V4's window slots of every token: slots [T * window] (-1 past lens[t]) and
// lens [T], through a.cache's block table.
void sparse_window_slots(const SparseDecodeArgs& a, std::vector<std::int32_t>& slots, std::vector<std::int32_t>& lens);

// Capability checks shared by every backend's supports().
Support check_capabilities(const Capabilities& caps, const CaseSpec& spec, Op op);
// The block size this backend runs a case with (the case's, or the preferred one).
int resolve_block_size(const Capabilities& caps, const CaseSpec& spec);

}  // namespace mlagate

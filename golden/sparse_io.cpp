// The sparse part of a golden file (detail/sparse_io.h): written by the export,
// read and validated value by value before any backend may act on it.
#include "golden/detail/sparse_io.h"

#include <cmath>
#include <cstring>
#include <string>

#include "cases/errors.h"
#include "reference/glue.h"
#include "reference/sparse_reference.h"

namespace mlagate::golden {

namespace {

constexpr std::int64_t kIntMax = 1 << 30;

Tensor i32_tensor(const std::vector<std::int32_t>& v, Shape shape) {
  Tensor t(DType::kI32, std::move(shape));
  std::copy(v.begin(), v.end(), t.data<std::int32_t>());
  return t;
}

// Rows of request-local positions: each -1, -2 (only past the length), a
// past-the-end code (only where the case's pattern is oob) or a key of the
// token's request in [0, keys(request)); lengths within [0, K].
void check_rows(const IndexSet& s, const std::vector<int>& req, const std::vector<std::int32_t>& keys,
                const io::Where& w, const char* what, bool past_end) {
  for (std::size_t t = 0; t < req.size(); ++t) {
    const int n = s.count(static_cast<int>(t));
    if (n < 0 || n > s.width)
      io::bad(w / (std::string(what) + "_length"), "length " + std::to_string(n) + " of token " + std::to_string(t) +
                                                       " outside [0, " + std::to_string(s.width) + "]");
    for (int k = 0; k < s.width; ++k) {
      const std::int32_t v = s.pos[t * static_cast<std::size_t>(s.width) + static_cast<std::size_t>(k)];
      const int have = keys[static_cast<std::size_t>(req[t])];
      // Past the length (the lens patterns): poisoned slots, and for
      // lens_garbage indices past the pool too.
      const bool ok = v == kIndexInvalid || (v == kIndexPoisoned && k >= n) || ((past_end || k >= n) && is_past_end(v)) ||
                      (v >= 0 && v < have);
      if (!ok)
        io::bad(w / what, "index " + std::to_string(v) + " at token " + std::to_string(t) + ", slot " + std::to_string(k) +
                              " is neither -1" + (k >= n ? ", -2" : "") + (past_end ? ", a past-the-end code" : "") +
                              " nor a key of request " +
                              std::to_string(req[t]) + " (which has " + std::to_string(have) + ")");
    }
  }
}

}  // namespace

void write_sparse_spec(hid_t g, const SparseSpec& s, const io::Where& w) {
  if (!s.active()) return;
  io::write_attr(g, "sparse_topk", s.topk, w);
  io::write_attr(g, "sparse_window", s.window, w);
  io::write_attr(g, "sparse_compress", s.compress, w);
  io::write_attr(g, "sparse_extra_topk", s.extra_topk, w);
  io::write_attr(g, "sparse_sink", s.sink ? 1 : 0, w);
  io::write_attr(g, "sparse_index_pattern", std::string(index_pattern_name(s.pattern)), w);
}

SparseSpec read_sparse_spec(hid_t g, const io::Where& w) {
  SparseSpec s;
  if (!io::has_attr(g, "sparse_topk", w)) return s;
  s.topk = static_cast<int>(io::read_int(g, "sparse_topk", w, 0, kIntMax));
  s.window = static_cast<int>(io::read_int(g, "sparse_window", w, 0, kIntMax));
  s.compress = static_cast<int>(io::read_int(g, "sparse_compress", w, 0, kIntMax));
  s.extra_topk = static_cast<int>(io::read_int(g, "sparse_extra_topk", w, 0, kIntMax));
  s.sink = io::read_int(g, "sparse_sink", w, 0, 1) == 1;
  try {
    s.pattern = parse_index_pattern(io::read_string(g, "sparse_index_pattern", w, 64));
  } catch (const GoldenFileError&) {
    throw;
  } catch (const InputError& e) {
    io::bad(w, e.what());
  }
  return s;
}

PreparedCase::SparseReference compute_sparse_reference(const Case& c) {
  std::vector<int> tokens(static_cast<std::size_t>(c.num_tokens));
  for (int t = 0; t < c.num_tokens; ++t) tokens[static_cast<std::size_t>(t)] = t;
  Tensor ql, qp;
  absorb_queries(c, tokens, ql, qp);
  PreparedCase::SparseReference r;
  r.q = sparse_query(c, ql.view());
  SparseReference g = sparse_golden(c, r.q.view());
  r.o = std::move(g.o);
  r.lse = std::move(g.lse);
  return r;
}

void write_sparse_group(hid_t g, const Case& c, const PreparedCase::SparseReference& ref, const io::Where& w) {
  const SparseInputs& sp = *c.sparse;
  const h5::Group sg = io::create_group(g, kSparseGroup, w);
  const io::Where ws = w / kSparseGroup;
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads();
  io::write_attr(sg.get(), "reference", "fp64 over the dequantized caches (reference/sparse_reference.h sparse_golden)", ws);
  io::write_attr(sg.get(), "index_codes",
                 "request-local key positions; -1 no key; -2 past the length, a poisoned slot; pattern oob: "
                 "-3 - d (d in [0, 64]) index s_kv + d, INT32_MIN + r (r < 2^29) index INT32_MAX - r, both no key",
                 ws);
  io::write_tensor(sg.get(), "q", ref.q, ws);
  io::write_dataset(sg.get(), "o", DType::kF64, {T, N, c.spec.sparse_dv()}, ref.o.data(), ws, io::Compress::kNone);
  io::write_dataset(sg.get(), "lse", DType::kF64, {T, N}, ref.lse.data(), ws, io::Compress::kNone);
  auto write_set = [&](const IndexSet& s, const char* name) {
    if (s.empty()) return;
    io::write_tensor(sg.get(), name, i32_tensor(s.pos, {T, s.width}), ws);
    if (!s.length.empty()) io::write_tensor(sg.get(), std::string(name) + "_length", i32_tensor(s.length, {T}), ws);
  };
  write_set(sp.main, "indices");
  write_set(sp.extra, "extra_indices");
  if (!sp.sink.empty()) io::write_dataset(sg.get(), "sink", DType::kF32, {N}, sp.sink.data(), ws);
  if (c.spec.sparse.compress > 0) {
    io::write_tensor(sg.get(), "compressed_kv_c", sp.compressed.kv_c, ws);
    io::write_tensor(sg.get(), "compressed_k_pe", sp.compressed.k_pe, ws);
  }
}

StoredSparse read_sparse_group(hid_t g, const Case& c, const io::Where& w, io::Budget& budget) {
  const SparseSpec& spec = c.spec.sparse;
  if (!io::has_link(g, kSparseGroup, w)) io::bad(w, "a sparse case without its '" + std::string(kSparseGroup) + "' group");
  const h5::Group sg = io::open_group(g, kSparseGroup, w);
  const io::Where ws = w / kSparseGroup;
  const std::int64_t T = c.num_tokens, N = c.spec.num_heads(), D = c.spec.dims.kv_lora_rank + c.spec.dims.rope_dim;
  const std::int64_t Dv = c.spec.sparse_dv();
  const std::vector<int> req = token_requests(c);
  auto inputs = std::make_shared<SparseInputs>();
  auto read_set = [&](IndexSet& s, int width, const char* name, bool lengths, const std::vector<std::int32_t>& keys,
                      bool past_end) {
    s.width = width;
    s.pos = io::i32_values(io::read_tensor(sg.get(), name, DType::kI32, {T, width}, ws, budget));
    if (lengths) s.length = io::i32_values(io::read_tensor(sg.get(), std::string(name) + "_length", DType::kI32, {T}, ws, budget));
    check_rows(s, req, keys, ws, name, past_end);
  };
  if (spec.topk > 0)
    read_set(inputs->main, spec.topk, "indices", has_topk_length(spec.pattern), c.seq_lens,
             spec.pattern == IndexPattern::kOutOfRange);
  if (spec.compress > 0) {
    inputs->compressed = compressed_layout(c);
    Case& k = inputs->compressed;
    k.kv_c = io::read_tensor(sg.get(), "compressed_kv_c", c.spec.dtype, {k.num_kv_tokens, c.spec.dims.kv_lora_rank}, ws, budget);
    k.k_pe = io::read_tensor(sg.get(), "compressed_k_pe", c.spec.dtype, {k.num_kv_tokens, c.spec.dims.rope_dim}, ws, budget);
    fill_cache_values(k);
    read_set(inputs->extra, spec.extra_topk, "extra_indices", true, k.seq_lens, false);
  }
  if (spec.sink) {
    const Tensor s = io::read_tensor(sg.get(), "sink", DType::kF32, {N}, ws, budget);
    inputs->sink.assign(s.data<float>(), s.data<float>() + N);
    for (std::int64_t h = 0; h < N; ++h)
      if (!std::isfinite(inputs->sink[static_cast<std::size_t>(h)]))
        io::bad(ws / "sink", "sink of head " + std::to_string(h) + " is not finite");
  }
  StoredSparse out;
  out.ref.q = io::read_tensor(sg.get(), "q", c.spec.dtype, {T, N, D}, ws, budget);
  out.ref.o = [&] {
    const Tensor t = io::read_tensor(sg.get(), "o", DType::kF64, {T, N, Dv}, ws, budget);
    return std::vector<double>(t.data<double>(), t.data<double>() + t.numel());
  }();
  out.ref.lse = [&] {
    const Tensor t = io::read_tensor(sg.get(), "lse", DType::kF64, {T, N}, ws, budget);
    return std::vector<double>(t.data<double>(), t.data<double>() + t.numel());
  }();
  // The query follows from the inputs; a reference must be finite except the
  // lse of a token with no key (an infinity there).
  Case with = c;
  with.sparse = inputs;
  {
    std::vector<int> tokens(static_cast<std::size_t>(T));
    for (int t = 0; t < T; ++t) tokens[static_cast<std::size_t>(t)] = t;
    Tensor ql, qp;
    absorb_queries(c, tokens, ql, qp);
    const Tensor q = sparse_query(c, ql.view());
    if (q.nbytes() != out.ref.q.nbytes() || std::memcmp(q.bytes(), out.ref.q.bytes(), q.nbytes()) != 0)
      io::bad(ws / "q",
              "differs from the query the stored inputs give (absorbed q_nope, then q_pe); a file written before "
              "2026-12-04 may hold queries absorbed by Eigen, whose bits depended on the machine: re-export it");
  }
  std::vector<int> mp, ep;
  for (std::int64_t t = 0; t < T; ++t) {
    main_positions(with, static_cast<int>(t), mp);
    extra_positions(with, static_cast<int>(t), ep);
    const bool empty = mp.empty() && ep.empty();
    for (std::int64_t h = 0; h < N; ++h) {
      const double l = out.ref.lse[static_cast<std::size_t>(t * N + h)];
      if (empty ? !std::isinf(l) : !std::isfinite(l))
        io::bad(ws / "lse", "lse " + std::to_string(l) + " at token " + std::to_string(t) + ", head " + std::to_string(h) +
                                (empty ? " (a token with no key must have an infinite lse)" : " is not finite"));
    }
  }
  for (std::size_t k = 0; k < out.ref.o.size(); ++k)
    if (!std::isfinite(out.ref.o[k])) io::bad(ws / "o", "element " + std::to_string(k) + " is not finite");
  out.inputs = std::move(inputs);
  return out;
}

}  // namespace mlagate::golden

// apply_token_bitmask_: structured outputs' token masks applied in place, straight from the
// packed bitmask llguidance fills ([rows, ceil(vocab / 32)] int32, bit t % 32 of word t / 32
// set = token t allowed): logits[dst[i], t] = -inf wherever bit t of bitmask[src[i]] is 0, and
// for every t past the bitmask's width. Rows not named in dst are not touched. One pass over
// each masked row, nothing allocated (unpacking into a float bias first writes 4 bytes per
// token and evicts the forward's cache).
#include "ops.h"

#include <ATen/Parallel.h>
#include <algorithm>
#include <limits>

namespace {

template <typename T>
void apply_token_bitmask_kernel(T* logits, int64_t stride, int64_t vocab, const uint32_t* bits, int64_t words,
                                const int64_t* dst, const int64_t* src, int64_t n) {
  const T neg = static_cast<T>(-std::numeric_limits<float>::infinity());
  const int64_t covered = std::min(vocab, words * 32);
  at::parallel_for(0, n, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* row = logits + dst[i] * stride;
      const uint32_t* w = bits + src[i] * words;
      for (int64_t base = 0; base < covered; base += 32) {
        const uint32_t m = w[base / 32];
        if (m == 0xffffffffu) continue;
        const int64_t lim = std::min<int64_t>(32, covered - base);
        if (m == 0) {
          std::fill(row + base, row + base + lim, neg);
          continue;
        }
        for (int64_t j = 0; j < lim; ++j)
          if (!((m >> j) & 1u)) row[base + j] = neg;
      }
      std::fill(row + covered, row + vocab, neg);
    }
  });
}

}  // namespace

void apply_token_bitmask_(torch::Tensor logits, torch::Tensor bitmask, torch::Tensor dst, torch::Tensor src) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "logits must be [rows, vocab] with contiguous rows");
  TORCH_CHECK(bitmask.dim() == 2 && bitmask.is_contiguous() && bitmask.scalar_type() == torch::kInt32,
              "bitmask must be a contiguous [rows, words] int32 tensor");
  TORCH_CHECK(dst.dim() == 1 && src.dim() == 1 && dst.size(0) == src.size(0) && dst.is_contiguous() &&
              src.is_contiguous() && dst.scalar_type() == torch::kInt64 && src.scalar_type() == torch::kInt64,
              "dst and src must be int64 vectors of one length");
  const int64_t n = dst.size(0);
  const int64_t* d = dst.data_ptr<int64_t>();
  const int64_t* s = src.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(d[i] >= 0 && d[i] < logits.size(0), "dst row ", d[i], " outside the ", logits.size(0), " logits rows");
    TORCH_CHECK(s[i] >= 0 && s[i] < bitmask.size(0), "src row ", s[i], " outside the ", bitmask.size(0), " masks");
  }
  const auto* bits = reinterpret_cast<const uint32_t*>(bitmask.data_ptr<int32_t>());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "apply_token_bitmask_", [&] {
    apply_token_bitmask_kernel<scalar_t>(logits.data_ptr<scalar_t>(), logits.stride(0), logits.size(1), bits,
                                         bitmask.size(1), d, s, n);
  });
}

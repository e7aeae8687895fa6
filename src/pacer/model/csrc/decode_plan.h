// The task plan of the vectorised decode attention tiles (paged_attention.cpp), flash-decoding
// style: a context past DECODE_PART tokens is split into parts that the threads share; each part
// keeps its own softmax max and exp sum beside its unnormalised value sums, and `combine_parts`
// rescales the parts to their largest max and adds them. A row of one part is written directly.
#pragma once
#include "convert.h"

#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace pacer {

// Tasks of the vectorised decode tiles: (row, first kv head, part of the context).
constexpr int64_t DECODE_PART = 256;   // tokens a task attends to at most (a multiple of 16)

struct DecodeTask {
  int64_t row, g0, t_lo, t_hi, slot;   // slot: its partials' index, -1 when it is its row's only part
};

struct SplitHeads {                   // a (row, kv heads) split into parts: its partials' slots
  int64_t row, g0, first_slot, parts;
};

struct DecodePlan {
  std::vector<DecodeTask> tasks;
  std::vector<SplitHeads> splits;      // what `combine_parts` adds up after the tasks
  int64_t heads_per_task = 0, n_slots = 0;
};

// Parts of at most DECODE_PART tokens per row; all kv heads per task unless the parts are fewer
// than twice the threads (then one task per kv head too).
inline DecodePlan plan_decode(const int64_t* ctx_lens, int64_t num_rows, int64_t n_kv) {
  DecodePlan plan;
  int64_t parts = 0;
  for (int64_t r = 0; r < num_rows; ++r) parts += (ctx_lens[r] + DECODE_PART - 1) / DECODE_PART;
  const int64_t split = parts >= 2 * at::get_num_threads() ? 1 : n_kv;
  plan.heads_per_task = n_kv / split;
  plan.tasks.reserve(parts * split);
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t ctx = ctx_lens[r], n = (ctx + DECODE_PART - 1) / DECODE_PART;
    for (int64_t g0 = 0; g0 < n_kv; g0 += plan.heads_per_task) {
      if (n > 1) plan.splits.push_back({r, g0, plan.n_slots, n});
      for (int64_t p = 0; p < n; ++p)
        plan.tasks.push_back({r, g0, p * DECODE_PART, std::min(ctx, (p + 1) * DECODE_PART), n > 1 ? plan.n_slots++ : -1});
    }
  }
  return plan;
}

// A task's result: its row's output when it is the only part, else its partials (the
// unnormalised sums `acc`, the scores' max `m` and the exp sum `l` of each of its hq heads).
template <typename T>
inline void finish_task(const DecodeTask& task, int64_t hq, int64_t D, const float* acc, const float* m,
                        const float* l, T* out, int64_t out_stride, int64_t group, float* part_acc, float* part_ml) {
  if (task.slot < 0) {
    for (int64_t h = 0; h < hq; ++h) {
      const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
      T* op = out + task.row * out_stride + (task.g0 * group + h) * D;
      for (int64_t i = 0; i < D; ++i) op[i] = from_f<T>(acc[h * D + i] * inv);
    }
    return;
  }
  std::memcpy(part_acc + task.slot * hq * D, acc, hq * D * sizeof(float));
  for (int64_t h = 0; h < hq; ++h) {
    part_ml[(task.slot * hq + h) * 2] = m[h];
    part_ml[(task.slot * hq + h) * 2 + 1] = l[h];
  }
}

// The rows split into parts: each head's output is the parts' sums rescaled to the largest max.
template <typename T>
void combine_parts(const DecodePlan& plan, int64_t hq, int64_t D, int64_t group, const float* part_acc,
                   const float* part_ml, T* out, int64_t out_stride) {
  at::parallel_for(0, static_cast<int64_t>(plan.splits.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(D);
    for (int64_t k = begin; k < end; ++k) {
      const SplitHeads& sp = plan.splits[k];
      for (int64_t h = 0; h < hq; ++h) {
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t p = 0; p < sp.parts; ++p) mx = std::max(mx, part_ml[((sp.first_slot + p) * hq + h) * 2]);
        std::fill(sum.begin(), sum.end(), 0.f);
        float total = 0.f;
        for (int64_t p = 0; p < sp.parts; ++p) {
          const float* ml = part_ml + ((sp.first_slot + p) * hq + h) * 2;
          if (ml[1] <= 0.f) continue;
          const float w = std::exp(ml[0] - mx);
          total += w * ml[1];
          const float* a = part_acc + ((sp.first_slot + p) * hq + h) * D;
          for (int64_t i = 0; i < D; ++i) sum[i] += w * a[i];
        }
        const float inv = total > 0.f ? 1.f / total : 0.f;
        T* op = out + sp.row * out_stride + (sp.g0 * group + h) * D;
        for (int64_t i = 0; i < D; ++i) op[i] = from_f<T>(sum[i] * inv);
      }
    }
  });
}

}  // namespace pacer

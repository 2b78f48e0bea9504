// Batched token sampling over a [rows, vocab] f32 logits buffer, one row per request: the native twin of
// the temperature / min_p / top-k / top-p / draw steps of src/engine/sampler.ts (the JS path is the
// reference and the fallback; test/engine/sampler-native.test.ts compares the two).
#pragma once
#include <cstdint>

namespace kiln {

// Which steps a sampleRows call runs (the sampler splits them when argmax-invariant logits processors
// must see the temperature-scaled batch before the masks and the draw).
enum SampleStage : int {
  kSampleScale = 1,  // greedy rows: out = argmax; random rows: logits *= 1/T
  kSampleDraw = 2,   // random rows: min_p, top-k/top-p masks, inverse-CDF draw -> out
  kSampleAll = 3,
};

struct SampleRowsArgs {
  float* logits;               // [rows, vocab], edited in place: ends up holding the processed logits
  int64_t rows, vocab;         // vocab >= 1
  const double* temperature;   // [rows]; 0 = greedy (argmax of the logits as given)
  const int32_t* topK;         // [rows]; 0 = off
  const double* topP;          // [rows]; >= 1 = off
  const double* minP;          // [rows]; 0 = off
  const double* uniform;       // [rows]; the row's draw in [0, 1), read for random rows only
  int32_t* out;                // [rows]; token ids (greedy rows by kSampleScale, random rows by kSampleDraw)
  int stages;                  // SampleStage bits
};

// Runs the rows in parallel on the process thread pool.
void sampleRows(const SampleRowsArgs& args);

}  // namespace kiln

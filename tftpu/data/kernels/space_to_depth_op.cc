// TftpuSpaceToDepth: host-side space-to-depth of an NHWC image batch with the float conversion
// fused in, for tf.data input pipelines (tftpu.data.space_to_depth).
//
//   output[n, i, j, (dy*b + dx)*C + c] = f(images[n, i*b + dy, j*b + dx, c])   (0 past H or W)
//   f(x) = float(x) * scale[c] + offset[c]   (each of scale/offset optional; none: a plain copy)
//
// Why a kernel: S2D interleaves rows in runs of b*C values (6 for RGB, b=2). Generic transpose
// code (Eigen, XLA) moves those one element at a time, unvectorised, which costs a realistic
// input pipeline 6-10% of its throughput. Here the b source rows of an output row are converted
// with contiguous, vectorisable arithmetic into a small buffer, then interleaved as fixed-size
// runs (constant-size copies the compiler turns into a few vector moves) into the output row,
// which is written front to back. Multiply and add round
// separately (built with -ffp-contract=off), so results equal TensorFlow's cast * scale + offset.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tftpu {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TftpuSpaceToDepth")
    .Input("images: T")
    .Input("scale: float")
    .Input("offset: float")
    .Output("output: out_type")
    .Attr("T: {uint8, float}")
    .Attr("out_type: {uint8, float}")
    .Attr("block_size: int >= 2")
    .Attr("parallel: bool = true")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle in;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &in));
      int b;
      TF_RETURN_IF_ERROR(c->GetAttr("block_size", &b));
      auto blocked = [&](DimensionHandle d, int64_t factor, bool divide) {
        if (!c->ValueKnown(d)) return c->UnknownDim();
        int64_t v = c->Value(d);
        return c->MakeDim(divide ? (v + factor - 1) / factor : v * factor);
      };
      c->set_output(0, c->MakeShape({c->Dim(in, 0), blocked(c->Dim(in, 1), b, true),
                                     blocked(c->Dim(in, 2), b, true),
                                     blocked(c->Dim(in, 3), int64_t{b} * b, false)}));
      return absl::OkStatus();
    })
    .Doc("Space-to-depth of [N, H, W, C] images with optional fused float conversion.");

// Converts one source row of `n` values into `dst` (scale/offset tiled to the row length).
template <typename In, typename Out>
void ConvertRow(const In* src, Out* dst, int64_t n, const float* scale, const float* offset) {
  if (scale && offset) {
    for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<Out>(src[k]) * scale[k] + offset[k];
  } else if (scale) {
    for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<Out>(src[k]) * scale[k];
  } else if (offset) {
    for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<Out>(src[k]) + offset[k];
  } else {
    for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<Out>(src[k]);
  }
}

// Writes one output row: for each of `runs` output pixels, run j of each of the `rows` converted
// source rows in turn (rows are `row_len` apart in `src`), so `dst` is written front to back.
template <int kRun, typename T>
void InterleaveRuns(const T* src, T* dst, int64_t runs, int64_t rows, int64_t row_len) {
  for (int64_t j = 0; j < runs; ++j)
    for (int64_t dy = 0; dy < rows; ++dy, dst += kRun)
      std::memcpy(dst, src + dy * row_len + j * kRun, kRun * sizeof(T));
}

template <typename T>
void InterleaveRunsAnySize(const T* src, T* dst, int64_t runs, int64_t rows, int64_t row_len, int64_t run) {
  switch (run) {
#define TFTPU_RUN(K) \
  case K:            \
    return InterleaveRuns<K>(src, dst, runs, rows, row_len);
    TFTPU_RUN(1) TFTPU_RUN(2) TFTPU_RUN(3) TFTPU_RUN(4) TFTPU_RUN(6) TFTPU_RUN(8)
    TFTPU_RUN(9) TFTPU_RUN(12) TFTPU_RUN(16) TFTPU_RUN(24) TFTPU_RUN(32) TFTPU_RUN(48)
#undef TFTPU_RUN
    default:
      for (int64_t j = 0; j < runs; ++j)
        for (int64_t dy = 0; dy < rows; ++dy, dst += run)
          std::memcpy(dst, src + dy * row_len + j * run, run * sizeof(T));
  }
}

template <typename In, typename Out>
class SpaceToDepthOp : public OpKernel {
 public:
  explicit SpaceToDepthOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("block_size", &block_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("parallel", &parallel_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& images = ctx->input(0);
    OP_REQUIRES(ctx, images.dims() == 4,
                absl::InvalidArgumentError(absl::StrCat(
                    "TftpuSpaceToDepth: images must be [N, H, W, C], got shape ",
                    images.shape().DebugString())));
    const int64_t b = block_, n = images.dim_size(0), h = images.dim_size(1),
                  w = images.dim_size(2), ch = images.dim_size(3);
    const int64_t ho = (h + b - 1) / b, wo = (w + b - 1) / b, depth = ch * b * b, run = b * ch;
    const int64_t row_len = wo * run;  // one source row, zero-padded to a multiple of b pixels
    std::vector<float> scale, offset;
    OP_REQUIRES_OK(ctx, Tiled(ctx->input(1), "scale", ch, row_len, &scale));
    OP_REQUIRES_OK(ctx, Tiled(ctx->input(2), "offset", ch, row_len, &offset));
    constexpr bool kFloatOut = std::is_same<Out, float>::value;
    OP_REQUIRES(ctx, (scale.empty() && offset.empty()) || kFloatOut,
                absl::InvalidArgumentError("TftpuSpaceToDepth: scale/offset need a float output"));

    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, ho, wo, depth}), &output));
    const In* in = images.flat<In>().data();
    Out* out = output->flat<Out>().data();
    const float* s = scale.empty() ? nullptr : scale.data();
    const float* o = offset.empty() ? nullptr : offset.data();

    // One unit of work = one output row (n, i): its b source rows are converted into `buffer`
    // (values past W stay zero: never written), then interleaved run by run into the output.
    auto work = [&](int64_t begin, int64_t end) {
      std::vector<Out> buffer(b * row_len, Out(0));
      for (int64_t r = begin; r < end; ++r) {
        const int64_t i = r % ho, batch = r / ho;
        for (int64_t dy = 0; dy < b; ++dy) {
          Out* row = buffer.data() + dy * row_len;
          if (i * b + dy < h) {
            ConvertRow(in + (batch * h + i * b + dy) * w * ch, row, w * ch, s, o);
          } else {  // bottom padding
            std::fill(row, row + row_len, Out(0));
          }
        }
        InterleaveRunsAnySize(buffer.data(), out + r * wo * depth, wo, b, row_len, run);
      }
    };
    if (!parallel_) {  // e.g. inside a parallel tf.data map, which already keeps the cores busy
      work(0, n * ho);
      return;
    }
    const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, n * ho,
                        /*cost_per_unit=*/b * w * ch * 4, work);
  }

 private:
  // Empty: not applied. One value or one per channel: tiled over a padded row.
  static absl::Status Tiled(const Tensor& t, const char* name, int64_t ch, int64_t len,
                            std::vector<float>* out) {
    const int64_t k = t.NumElements();
    if (k == 0) return absl::OkStatus();
    if (t.dims() > 1 || (k != 1 && k != ch))
      return absl::InvalidArgumentError(absl::StrCat("TftpuSpaceToDepth: ", name, " of shape ",
                                                     t.shape().DebugString(), ": expected [], [1] or [",
                                                     ch, "]"));
    const float* v = t.flat<float>().data();
    out->resize(len);
    for (int64_t i = 0; i < len; ++i) (*out)[i] = v[k == 1 ? 0 : i % ch];
    return absl::OkStatus();
  }

  int block_;
  bool parallel_;
};

#define TFTPU_REGISTER(In, Out)                                                    \
  REGISTER_KERNEL_BUILDER(Name("TftpuSpaceToDepth")                                \
                              .Device(DEVICE_CPU)                                  \
                              .TypeConstraint<In>("T")                             \
                              .TypeConstraint<Out>("out_type"),                    \
                          SpaceToDepthOp<In, Out>);
TFTPU_REGISTER(uint8_t, uint8_t)
TFTPU_REGISTER(uint8_t, float)
TFTPU_REGISTER(float, float)
#undef TFTPU_REGISTER

}  // namespace
}  // namespace tftpu

// Fused INT8 kernels of the TPU interpreter: requantization of INT32 accumulators and depthwise
// convolution with its requantization, in one pass each (tftpu/interp/tpu/native.py loads this
// with ctypes; tftpu.utils.native builds it once on first use).
//
// Why native: numpy needs 4-7 passes over every accumulator to requantize it (int64 or float64
// temporaries), and onnxruntime runs a depthwise conv of INT8 data only through float sessions
// that convert layouts on every call. Here each output element is made once, in registers.
//
// The arithmetic is exactly tftpu.rounding's (TFLite's MultiplyByQuantizedMultiplier with a
// right shift, then the zero point and the clamp), for multipliers in [0, 2**31) and right
// shifts in 0..31, on an accumulator saturated to int32 (tftpu/interp/tpu/requant.py proves
// the forms used here):
//   y = (t * m + 2**30) >> 31                     the doubling high multiply (floor)
//   z = (y + 2**(r-1) - [y < 0]) >> r             the rounding shift, ties away from zero
//   out = clamp(z, lo - zp, hi - zp) + zp
// and, where lo - zp >= 0 (a fused ReLU), the one shift (t * m + 2**30 + 2**(r-1) * 2**31) >> (31 + r).
// Depthwise sums accumulate in int32; the caller guarantees they cannot overflow.
//
// Built once per instruction-set variant (tftpu.utils.isa; the loader picks the best one the CPU
// runs): the code is chosen by the compiler's predefined macros, never by -march=native. The GEMM
// of ungrouped convs: vpdpbusd on zmm (AVX-512 VNNI) > vpdpbusd on ymm (AVX-VNNI) > vpmaddwd on
// zmm (AVX-512BW) > vpmaddwd on ymm (AVX2) > vpmaddwd on xmm (SSE2, the generic x86-64 build)
// > plain C++ loops (other CPUs); the AVX-512BW and AVX2 builds also have a vpmaddubsw kernel for
// inputs that span at most 128 values (ReLU outputs), chosen per call. Requantization: 16 lanes on
// AVX-512, 8 on AVX2, else scalar (written for the compiler to vectorise). The depthwise conv:
// vpmaddwd (or vpdpwssd) on pairs of taps, 32 outputs a step on AVX-512, 16 on AVX2, else
// scalar loops. Every form computes the same integers (tests/interp/test_int8_native.py runs
// each variant this CPU can execute against one integer reference).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <new>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define TFTPU_AVX512 1
#endif
#if defined(__AVX2__)
#define TFTPU_AVX2 1
#endif

#define TFTPU_INLINE inline __attribute__((always_inline))

namespace {

constexpr int64_t kInt32Min = -(int64_t(1) << 31);
constexpr int64_t kInt32Max = (int64_t(1) << 31) - 1;

// Per-thread scratch memory kept from call to call (slot: one buffer per use within a call). A
// fresh multi-megabyte std::vector on every call costs page faults and the kernel's zeroing of
// every new page, more than filling it; and a vector zero-fills what the caller overwrites
// anyway. Each thread keeps the largest size it has needed (a few megabytes for ResNet50).
template <typename T>
T* scratch(int slot, int64_t n) {
  struct Buffer {
    std::unique_ptr<unsigned char[]> data;
    size_t size = 0;
  };
  thread_local Buffer buffers[4];
  Buffer& b = buffers[slot];
  const size_t bytes = size_t(std::max<int64_t>(n, 1)) * sizeof(T) + 64;
  if (b.size < bytes) {
    b.data.reset();
    b.data.reset(new unsigned char[bytes]);
    b.size = bytes;
  }
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(b.data.get()) + 63) & ~uintptr_t(63));
}

// The constants of one channel's requantization.
struct Channel {
  int64_t bias, m, add;
  int shift, r;
  int64_t half, lo, hi, zp;
  bool combined;
};

TFTPU_INLINE Channel channel(int64_t bias, int64_t m, int r, int64_t lo, int64_t hi, int64_t zp) {
  Channel c;
  c.bias = bias;
  c.m = m;
  c.r = r;
  c.half = r > 0 ? int64_t(1) << (r - 1) : 0;
  c.lo = lo - zp;
  c.hi = hi - zp;
  c.zp = zp;
  c.combined = c.lo >= 0;
  c.add = (int64_t(1) << 30) + (c.half << 31);
  c.shift = 31 + r;
  return c;
}

// Requantize n accumulators of one channel into out.
template <typename Acc, typename Out>
TFTPU_INLINE void requant_run(const Acc* __restrict__ acc, int64_t n, const Channel& c, Out* __restrict__ out) {
  const int64_t bias = c.bias, m = c.m, lo = c.lo, hi = c.hi, zp = c.zp;
  if (c.combined) {
    const int64_t add = c.add;
    const int shift = c.shift;
    for (int64_t i = 0; i < n; ++i) {
      int64_t t = std::min(std::max(int64_t(acc[i]) + bias, kInt32Min), kInt32Max);
      int64_t y = (t * m + add) >> shift;
      out[i] = Out(std::min(std::max(y, lo), hi) + zp);
    }
  } else if (c.r > 0) {
    const int64_t half = c.half;
    const int r = c.r;
    for (int64_t i = 0; i < n; ++i) {
      int64_t t = std::min(std::max(int64_t(acc[i]) + bias, kInt32Min), kInt32Max);
      int64_t y = (t * m + (int64_t(1) << 30)) >> 31;
      y = (y + half - (y >> 63 & 1)) >> r;
      out[i] = Out(std::min(std::max(y, lo), hi) + zp);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      int64_t t = std::min(std::max(int64_t(acc[i]) + bias, kInt32Min), kInt32Max);
      int64_t y = (t * m + (int64_t(1) << 30)) >> 31;
      out[i] = Out(std::min(std::max(y, lo), hi) + zp);
    }
  }
}

// Requantize n int32 sums of one channel plus its `bias` where the caller proved that no sum plus
// bias leaves int32: int32 additions (which wrap) then give the exact value, nothing saturates,
// and the bias may be passed wrapped to int32. One-byte and int16 outputs (16-bit links) take 16
// lanes at a time on AVX-512 (Requant16), 8 on AVX2 (Requant8): the doubling high multiply as two 32x32->64
// multiplies (vpmuldq, even and odd lanes) in int64, then every shift, the rounding and the
// clamp in int32. The products fit int64: |t * m| < 2**62 and the added constant is below
// 2**30 + 2**61 (the combined form: half * 2**31 with half <= 2**30); and every shifted result
// fits int32 (t * m / 2**31 does), so it is made from the int32 halves of the products.
#ifdef TFTPU_AVX512
// requant_exact32's arithmetic on 16 int32 lanes (sums plus bias already added), each shift on
// int32 lanes where its result fits int32 (Requant8 below argues each step; the same steps).
struct Requant16 {
  __m512i vm, vadd, vmask, vthr, vlo, vhi, vzp;
  __m128i vr, vhigh;
  bool round, high;

  explicit Requant16(const Channel& c)
      : vm(_mm512_set1_epi64(c.m)), vadd(_mm512_set1_epi64(c.combined ? c.add : int64_t(1) << 30)),
        vmask(_mm512_set1_epi32(int32_t((int64_t(1) << c.r) - 1))),
        vthr(_mm512_set1_epi32(int32_t(((int64_t(1) << c.r) - 1) >> 1))), vlo(_mm512_set1_epi32(int32_t(c.lo))),
        vhi(_mm512_set1_epi32(int32_t(c.hi))), vzp(_mm512_set1_epi32(int32_t(c.zp))), vr(_mm_cvtsi64_si128(c.r)),
        vhigh(_mm_cvtsi64_si128(c.r - 1)), round(!c.combined && c.r > 0), high(c.combined && c.r > 0) {}

  // the requantized values (clamped, zero point added) in int32 lanes
  TFTPU_INLINE __m512i lanes(__m512i t) const {
    const __m512i ev = _mm512_add_epi64(_mm512_mul_epi32(t, vm), vadd);
    const __m512i od = _mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(t, 32), vm), vadd);
    const __mmask16 odd = 0xAAAA;
    __m512i y;
    if (high) {
      y = _mm512_sra_epi32(_mm512_mask_blend_epi32(odd, _mm512_srli_epi64(ev, 32), od), vhigh);
    } else {
      y = _mm512_mask_blend_epi32(odd, _mm512_srli_epi64(ev, 31), _mm512_slli_epi64(od, 1));
      if (round) {
        const __m512i thr = _mm512_add_epi32(vthr, _mm512_srli_epi32(y, 31));
        const __mmask16 up = _mm512_cmpgt_epi32_mask(_mm512_and_si512(y, vmask), thr);
        y = _mm512_mask_add_epi32(_mm512_sra_epi32(y, vr), up, _mm512_sra_epi32(y, vr), _mm512_set1_epi32(1));
      }
    }
    return _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(y, vlo), vhi), vzp);
  }
  // the low byte of every lane, as Out(...) truncates (one-byte outputs)
  TFTPU_INLINE __m128i operator()(__m512i t) const { return _mm512_cvtepi32_epi8(lanes(t)); }
  // the low two bytes of every lane (int16 outputs: a 16-bit link)
  TFTPU_INLINE __m256i words(__m512i t) const { return _mm512_cvtepi32_epi16(lanes(t)); }
};
#endif

#ifdef TFTPU_AVX2
// requant_exact32's arithmetic on 8 int32 lanes (sums plus bias already added) for AVX2 builds.
// AVX2 has no 64-bit arithmetic shift (vpsraq is AVX-512), and the shifts are cheaper on int32
// lanes anyway: every shift is made there, exactly, because each shifted result fits int32
// (above):
// - the products x = t * m + add are made in int64 (vpmuldq, even and odd lanes);
// - a shift by 31 (the doubling high multiply, and the fused ReLU form with r = 0): the int32
//   result x >> 31 is bits 31..62 of x, which a logical 64-bit shift by 31 (even lanes) or a
//   left shift by 1 (odd lanes, into the high half) puts in place whatever x's sign;
// - a shift by 31 + r with r >= 1 (the fused ReLU form): the low bits of x all fall off, so the
//   result is x's high int32 half shifted right by r - 1 (vpsrad);
// - the rounding shift of y by r (ties away from zero) in gemmlowp's form, which never leaves
//   int32 (y + 2**(r-1) could): (y >> r) + ((y & mask) > (mask >> 1) + [y < 0]), mask = 2**r - 1,
//   the mask and threshold both in [0, 2**31).
// Returns the 8 low bytes of the results in the low half.
struct Requant8 {
  __m256i vm, vadd, vmask, vthr, vlo, vhi, vzp;
  __m128i vr, vhigh;
  bool round, high;

  explicit Requant8(const Channel& c)
      : vm(_mm256_set1_epi64x(c.m)), vadd(_mm256_set1_epi64x(c.combined ? c.add : int64_t(1) << 30)),
        vmask(_mm256_set1_epi32(int32_t((int64_t(1) << c.r) - 1))),
        vthr(_mm256_set1_epi32(int32_t(((int64_t(1) << c.r) - 1) >> 1))), vlo(_mm256_set1_epi32(int32_t(c.lo))),
        vhi(_mm256_set1_epi32(int32_t(c.hi))), vzp(_mm256_set1_epi32(int32_t(c.zp))), vr(_mm_cvtsi64_si128(c.r)),
        vhigh(_mm_cvtsi64_si128(c.r - 1)), round(!c.combined && c.r > 0), high(c.combined && c.r > 0) {}

  // the requantized values (clamped, zero point added) in int32 lanes
  TFTPU_INLINE __m256i lanes(__m256i t) const {
    const __m256i ev = _mm256_add_epi64(_mm256_mul_epi32(t, vm), vadd);
    const __m256i od = _mm256_add_epi64(_mm256_mul_epi32(_mm256_srli_epi64(t, 32), vm), vadd);
    __m256i y;
    if (high) {
      y = _mm256_sra_epi32(_mm256_blend_epi32(_mm256_srli_epi64(ev, 32), od, 0xAA), vhigh);
    } else {
      y = _mm256_blend_epi32(_mm256_srli_epi64(ev, 31), _mm256_slli_epi64(od, 1), 0xAA);
      if (round) {
        const __m256i thr = _mm256_add_epi32(vthr, _mm256_srli_epi32(y, 31));
        const __m256i up = _mm256_cmpgt_epi32(_mm256_and_si256(y, vmask), thr);    // -1 where rounding up
        y = _mm256_sub_epi32(_mm256_sra_epi32(y, vr), up);
      }
    }
    return _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(y, vlo), vhi), vzp);
  }
  // the low byte of every lane (as Out(...) truncates): bytes 0, 4, 8, 12 of each 128-bit half
  // to its first four, then the two halves' first four side by side
  TFTPU_INLINE __m128i operator()(__m256i t) const {
    const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                               0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i y = _mm256_shuffle_epi8(lanes(t), low_bytes);
    return _mm_unpacklo_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
  }
  // the low two bytes of every lane (int16 outputs: a 16-bit link), the same way
  TFTPU_INLINE __m128i words(__m256i t) const {
    const __m256i low_words = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                               0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i y = _mm256_shuffle_epi8(lanes(t), low_words);
    return _mm_unpacklo_epi64(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
  }
};

// The lanes i < n of a vector (a mask for vpmaskmovd: the top bit of each selected lane).
TFTPU_INLINE __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(std::min<int64_t>(n, 8))), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

// The vector requantizer of this build (constants in registers, built once per channel and
// applied to many runs of its sums), or a placeholder where the build has none.
#if defined(TFTPU_AVX512)
using RequantV = Requant16;
#elif defined(TFTPU_AVX2)
using RequantV = Requant8;
#else
struct RequantV {
  explicit RequantV(const Channel&) {}
};
#endif

// requant_exact32 with the channel's vector requantizer already built (rq = RequantV(c)).
template <typename Out>
TFTPU_INLINE void requant_exact32(const int32_t* __restrict__ acc, int64_t n, int32_t bias, const Channel& c,
                                  [[maybe_unused]] const RequantV& rq, Out* __restrict__ out) {
#if defined(TFTPU_AVX512)
  if constexpr (sizeof(Out) == 1) {
    const __m512i vb = _mm512_set1_epi32(bias);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
      _mm_mask_storeu_epi8(out + i, k, rq(_mm512_add_epi32(_mm512_maskz_loadu_epi32(k, acc + i), vb)));
    }
    return;
  }
  if constexpr (sizeof(Out) == 2) {
    const __m512i vb = _mm512_set1_epi32(bias);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
      _mm256_mask_storeu_epi16(out + i, k, rq.words(_mm512_add_epi32(_mm512_maskz_loadu_epi32(k, acc + i), vb)));
    }
    return;
  }
#elif defined(TFTPU_AVX2)
  if constexpr (sizeof(Out) == 1) {
    const __m256i vb = _mm256_set1_epi32(bias);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + i));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), rq(_mm256_add_epi32(a, vb)));
    }
    if (i < n) {        // the last few: a masked load, stored through a buffer (no byte-masked store)
      alignas(16) Out last[16];
      _mm_storel_epi64(reinterpret_cast<__m128i*>(last),
                       rq(_mm256_add_epi32(_mm256_maskload_epi32(acc + i, first_lanes(n - i)), vb)));
      std::memcpy(out + i, last, (n - i) * sizeof(Out));
    }
    return;
  }
  if constexpr (sizeof(Out) == 2) {
    const __m256i vb = _mm256_set1_epi32(bias);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + i));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), rq.words(_mm256_add_epi32(a, vb)));
    }
    if (i < n) {
      alignas(16) Out last[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(last),
                      rq.words(_mm256_add_epi32(_mm256_maskload_epi32(acc + i, first_lanes(n - i)), vb)));
      std::memcpy(out + i, last, (n - i) * sizeof(Out));
    }
    return;
  }
#endif
  // the sums plus bias (wrapping int32 additions: exact, as above) a block at a time, then the
  // general form on them with no bias
  const Channel c0 = channel(0, c.m, c.r, c.lo + c.zp, c.hi + c.zp, c.zp);
  int32_t t[64];
  for (int64_t i = 0; i < n; i += 64) {
    const int64_t k = std::min<int64_t>(64, n - i);
    for (int64_t j = 0; j < k; ++j) t[j] = int32_t(uint32_t(acc[i + j]) + uint32_t(bias));
    requant_run(t, k, c0, out + i);
  }
}

template <typename Out>
TFTPU_INLINE void requant_exact32(const int32_t* __restrict__ acc, int64_t n, int32_t bias, const Channel& c,
                                  Out* __restrict__ out) {
  requant_exact32(acc, n, bias, c, RequantV(c), out);
}

// Parameters shared by the entry points, passed as one int64 array (one ctypes argument).
// requant:   [outer, channels, inner, lo, hi, zp, per_channel, exact32]
// depthwise: [N, C, H, W, zx, kh, kw, sh, sw, pt, pl, dh, dw, OH, OW, lo, hi, zp, per_channel, exact32]
// exact32: the caller proved that every sum plus its bias lies in int32 (requant_exact32)
struct Tables {
  const int32_t* bias;     // per channel, or null
  const int32_t* mult;     // per channel, or one value
  const int32_t* rshift;
};

TFTPU_INLINE Channel channel_of(const Tables& t, int64_t c, bool per_channel, int64_t lo, int64_t hi, int64_t zp) {
  const int64_t k = per_channel ? c : 0;
  return channel(t.bias ? t.bias[c] : 0, t.mult[k], t.rshift[k], lo, hi, zp);
}

template <typename Acc, typename Out>
TFTPU_INLINE void requant_impl(const Acc* acc, Out* out, const int64_t* p, const Tables& t, int64_t o0, int64_t o1) {
  const int64_t channels = p[1], inner = p[2], lo = p[3], hi = p[4], zp = p[5];
  const bool per_channel = p[6] != 0;
  if (inner == 1 && channels > 1) {      // channels last: the constants change every element
    std::vector<Channel> cs(channels);
    for (int64_t c = 0; c < channels; ++c) cs[c] = channel_of(t, c, per_channel, lo, hi, zp);
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t c = 0; c < channels; ++c)
        requant_run(acc + o * channels + c, 1, cs[c], out + o * channels + c);
    return;
  }
  // o0..o1 index (outer, channel) pairs: slabs split along both
  for (int64_t oc = o0; oc < o1; ++oc) {
    const Channel c = channel_of(t, oc % channels, per_channel, lo, hi, zp);
    if constexpr (std::is_same_v<Acc, int32_t>)
      if (p[7]) {
        requant_exact32(acc + oc * inner, inner, int32_t(c.bias), c, out + oc * inner);
        continue;
      }
    requant_run(acc + oc * inner, inner, c, out + oc * inner);
  }
}

// A depthwise conv (one filter per channel) of the planes of channels [c0, c1), each plane in one
// long vectorisable loop per tap, over 8-bit data or a 16-bit link (int16 with zero point 0, the
// chip's two passes over its high and low byte summed: the same int32 sums, which the caller
// bounds). The plane is copied once, centred (x - zx) and zero-padded, into
// sh * sw phase planes (phase (a, b) holds padded rows a, a + sh, ... and columns b, b + sw, ...:
// the polyphase split of a strided conv), each Wq = ceil(Wp / sw) wide. Output (oy, ox) then reads
// tap (ky, kx) from phase ((ky*dh) % sh, (kx*dw) % sw) at flat index oy*Wq + ox + constant: every
// tap is one loop over all oy*Wq + ox at once (the columns ox >= OW are computed and dropped),
// padded to a multiple of 32 so that no loop has a scalar remainder.
constexpr int64_t kVector = 32, kBlock = 512;

// The fast form (sums plus bias in int32, one-byte outputs): two taps at a time by vpmaddwd,
// which multiplies int16 pairs and adds each pair into an int32 lane: the inputs of taps k and
// k + 1 interleaved (vpunpck{l,h}wd) against the weight pair (w[k], w[k + 1]) in every lane.
// Exact: x - zx lies in [-255, 255] (a 16-bit link's x, zero point 0, in [-32768, 32767]) and w
// in [-128, 127], so a pair sums to at most 2 * 32768 * 128 in magnitude (vpmaddwd saturates
// nothing but -32768 * -32768 twice, which an 8-bit weight never is), and the
// int32 lane additions wrap, so the final sum plus bias, which the caller proved lies in int32,
// is exact. The unpacks interleave within 128-bit halves, so the two accumulators hold pixels
// {0-3, 8-11, ...} and {4-7, 12-15, ...}; one permute per vector restores the order before the
// requantization. AVX-512 VNNI and AVX-VNNI fuse the multiply and add (vpdpwssd, which wraps
// as vpaddd does).
#if defined(TFTPU_AVX512)
struct DwVec {
  using V = __m512i;
  static constexpr int64_t kStep = 32;    // outputs a step: one vector of int16 inputs
  static V load(const int16_t* p) { return _mm512_loadu_si512(p); }
  static V set1(int32_t v) { return _mm512_set1_epi32(v); }
  static V lo(V a, V b) { return _mm512_unpacklo_epi16(a, b); }
  static V hi(V a, V b) { return _mm512_unpackhi_epi16(a, b); }
  static V dot(V acc, V a, V b) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, a, b);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
  }
  // pixels 0-15 and 16-31 from the halves' interleaving: 128-bit pieces lo0 hi0 lo1 hi1 | lo2 hi2 lo3 hi3
  template <typename Out>
  static void store(Out* out, V l, V h, const Requant16& rq) {
    const V first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), rq(_mm512_permutex2var_epi64(l, first, h)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), rq(_mm512_permutex2var_epi64(l, second, h)));
  }
  using Requant = Requant16;
};
#elif defined(TFTPU_AVX2)
struct DwVec {
  using V = __m256i;
  static constexpr int64_t kStep = 16;
  static V load(const int16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static V set1(int32_t v) { return _mm256_set1_epi32(v); }
  static V lo(V a, V b) { return _mm256_unpacklo_epi16(a, b); }
  static V hi(V a, V b) { return _mm256_unpackhi_epi16(a, b); }
  static V dot(V acc, V a, V b) {
#if defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
  }
  template <typename Out>
  static void store(Out* out, V l, V h, const Requant8& rq) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), rq(_mm256_permute2x128_si256(l, h, 0x20)));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 8), rq(_mm256_permute2x128_si256(l, h, 0x31)));
  }
  using Requant = Requant8;
};
#endif
#if defined(TFTPU_AVX512) || defined(TFTPU_AVX2)
#define TFTPU_DW_FAST 1
static_assert(kVector % DwVec::kStep == 0, "the depthwise rows are padded for the vector step");
#endif

template <typename In, typename Out>
TFTPU_INLINE void depthwise_impl(const In* x, const int8_t* w, Out* y, const int64_t* p, const Tables& t,
                                 int64_t c0, int64_t c1) {
  const int64_t N = p[0], C = p[1], H = p[2], W = p[3], kh = p[5], kw = p[6], sh = p[7], sw = p[8], pt = p[9],
                pl = p[10], dh = p[11], dw = p[12], OH = p[13], OW = p[14];
  const int32_t z = int32_t(p[4]);
  const bool per_channel = p[18] != 0, exact32 = p[19] != 0;
  const int64_t Hp = std::max(H + pt, (OH - 1) * sh + (kh - 1) * dh + 1);
  const int64_t Wp = std::max(W + pl, (OW - 1) * sw + (kw - 1) * dw + 1);
  const int64_t Hq = (Hp + sh - 1) / sh, Wq = (Wp + sw - 1) / sw;
  const int64_t L = (OH * Wq + kVector - 1) / kVector * kVector;
  const int64_t reach = ((kh - 1) * dh / sh) * Wq + (kw - 1) * dw / sw;
  const int64_t phase_size = std::max(Hq * Wq, reach + L);
  int16_t* const phases = scratch<int16_t>(0, sh * sw * phase_size);
  int32_t* const acc = scratch<int32_t>(1, kBlock);
  Out* const out = scratch<Out>(2, L);
  int16_t* const row = scratch<int16_t>(3, sw * Wq);
  std::vector<int64_t> taps(kh * kw);        // where each tap reads, in the phases buffer
  for (int64_t ky = 0; ky < kh; ++ky)
    for (int64_t kx = 0; kx < kw; ++kx)
      taps[ky * kw + kx] = ((ky * dh % sh) * sw + kx * dw % sw) * phase_size + (ky * dh / sh) * Wq + kx * dw / sw;
#ifdef TFTPU_DW_FAST
  const int64_t pairs = (kh * kw + 1) / 2;
  std::vector<int32_t> wpair(pairs);      // (w[2j], w[2j + 1]) as int16 halves of one lane
  std::vector<int64_t> tap2(2 * pairs);   // where each tap of each pair reads
#endif
  // the padding is zero for every plane: filled once, and each plane overwrites only the rows
  // it holds (for sw > 1 whole phase rows, zeros included)
  std::fill(phases, phases + sh * sw * phase_size, int16_t(0));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ch = c0; ch < c1; ++ch) {
      const In* plane = x + (n * C + ch) * H * W;
      for (int64_t iy = 0; iy < H; ++iy) {
        const int64_t Y = iy + pt;
        const In* __restrict__ src = plane + iy * W;
        int16_t* __restrict__ first = phases + (Y % sh) * sw * phase_size + (Y / sh) * Wq;
        if (sw == 1) {                       // the row itself, centred, at column pl
          int16_t* __restrict__ d = first + pl;
          for (int64_t ix = 0; ix < W; ++ix) d[ix] = int16_t(int32_t(src[ix]) - z);
          continue;
        }
        // the padded row centred (zeros around), then dealt out to the sw column phases
        int16_t* __restrict__ r = row;
        std::fill(r, r + sw * Wq, int16_t(0));
        for (int64_t ix = 0; ix < W; ++ix) r[pl + ix] = int16_t(int32_t(src[ix]) - z);
        if (sw == 2) {
          int16_t* __restrict__ d0 = first;
          int16_t* __restrict__ d1 = first + phase_size;
          for (int64_t j = 0; j < Wq; ++j) {
            d0[j] = r[2 * j];
            d1[j] = r[2 * j + 1];
          }
        } else {
          for (int64_t b = 0; b < sw; ++b) {
            int16_t* __restrict__ d = first + b * phase_size;
            for (int64_t j = 0; j < Wq; ++j) d[j] = r[j * sw + b];
          }
        }
      }
      const int8_t* wc = w + ch * kh * kw;
      const Channel cq = channel_of(t, ch, per_channel, p[15], p[16], p[17]);
#ifdef TFTPU_DW_FAST
      if constexpr (sizeof(Out) == 1)
        if (exact32) {
          // an odd last tap pairs with weight 0 reading its own inputs again (any valid memory)
          for (int64_t j = 0; j < pairs; ++j) {
            const int64_t k0 = 2 * j, k1 = std::min(2 * j + 1, kh * kw - 1);
            const int32_t w1 = 2 * j + 1 < kh * kw ? wc[k1] : 0;
            wpair[j] = int32_t(uint32_t(uint16_t(int16_t(wc[k0]))) | uint32_t(uint16_t(int16_t(w1))) << 16);
            tap2[2 * j] = taps[k0];
            tap2[2 * j + 1] = taps[k1];
          }
          const typename DwVec::Requant rq(cq);
          const typename DwVec::V vb = DwVec::set1(int32_t(cq.bias));
          const int16_t* ph = phases;
          for (int64_t i = 0; i < L; i += DwVec::kStep) {
            typename DwVec::V lo = vb, hi = vb;     // the bias in every pixel's lane
            for (int64_t j = 0; j < pairs; ++j) {
              const typename DwVec::V a = DwVec::load(ph + tap2[2 * j] + i), b = DwVec::load(ph + tap2[2 * j + 1] + i);
              const typename DwVec::V wj = DwVec::set1(wpair[j]);
              lo = DwVec::dot(lo, DwVec::lo(a, b), wj);
              hi = DwVec::dot(hi, DwVec::hi(a, b), wj);
            }
            DwVec::store(out + i, lo, hi, rq);
          }
          Out* dst = y + (n * C + ch) * OH * OW;
          for (int64_t oy = 0; oy < OH; ++oy) std::memcpy(dst + oy * OW, out + oy * Wq, OW * sizeof(Out));
          continue;
        }
#endif
      // blocks of kBlock outputs keep their sums in L1 while every tap adds to them
      for (int64_t i0 = 0; i0 < L; i0 += kBlock) {
        const int64_t nb = std::min(kBlock, L - i0);
        int32_t* __restrict__ a = acc;
        std::fill(a, a + nb, 0);
        for (int64_t ky = 0; ky < kh; ++ky)
          for (int64_t kx = 0; kx < kw; ++kx) {
            const int32_t wv = wc[ky * kw + kx];
            if (wv == 0) continue;
            const int64_t pa = ky * dh % sh, pb = kx * dw % sw;
            const int16_t* __restrict__ src =
                phases + (pa * sw + pb) * phase_size + (ky * dh / sh) * Wq + kx * dw / sw + i0;
            for (int64_t i = 0; i < nb; ++i) a[i] += int32_t(src[i]) * wv;
          }
        if (exact32)
          requant_exact32(a, nb, int32_t(cq.bias), cq, out + i0);
        else
          requant_run(a, nb, cq, out + i0);
      }
      Out* dst = y + (n * C + ch) * OH * OW;
      for (int64_t oy = 0; oy < OH; ++oy) std::memcpy(dst + oy * OW, out + oy * Wq, OW * sizeof(Out));
    }
}

// An ungrouped conv of NCHW data as an INT8 GEMM: out[o][p] = sum_q w[o][q] * (row_q[p] - zx) +
// bias[o], requantized, where the rows are the input channels (1x1, stride 1, unpadded) or the
// im2col rows (c, ky, kx) of any other kernel. The input enters as unsigned bytes u = x - s
// (gemm_offset: x + 128 = x ^ 0x80 for int8 data and x itself for uint8, or x - min(x) where the
// input spans at most 128 values) and (s - zx) * sum_q w[o][q] is folded into the int64 bias, so
// every kernel multiplies bytes in [0, 255] by weights in [-128, 127], and the caller bounds
// Q * 255 * 128 below 2**31, so the int32 sums are exact:
// - VNNI (vpdpbusd, on zmm with AVX-512 VNNI, on ymm with AVX-VNNI) multiplies unsigned by signed
//   bytes and adds each group of four products to an int32 lane without saturating. The pixels
//   are packed [Q/4][pixels][4] bytes (four rows of one pixel per int32 lane).
// - Without VNNI, vpmaddubsw would saturate (two products of 255 * 128 exceed int16), so the
//   bytes are widened to int16 and vpmaddwd (zmm with AVX-512BW, else ymm) multiplies int16
//   pairs, adding each pair into an int32 lane (at most 2 * 255 * 128 in magnitude: exact; it
//   saturates only -32768 * -32768 twice), and vpaddd accumulates. The pixels are packed
//   [Q/2][pixels][2] int16: the same byte values, so the caller's bias is the same.
// - The narrow kernel of those builds (GemmNarrow), for inputs whose u lies in [0, 127]
//   (gemm_offset): vpmaddubsw multiplies unsigned by signed bytes and adds each pair into a
//   saturating int16 lane, exact here (|pair| <= 2 * 127 * 128 = 32512 < 2**15); vpmaddwd by
//   ones adds the int16 pairs into int32 lanes (exact), and vpaddd accumulates: 4 input channels
//   a lane in 3 instructions as against 2 in 2, and the pixels packed as for VNNI, bytes, half
//   the memory of the int16 packing. Most convs read ReLU outputs, which take it.
// - The generic x86-64 build does the same with SSE2's pmaddwd on xmm, other CPUs in plain
//   int32 loops over the int16 pairs.
// Accumulating lanes wrap (vpaddd, vpdpbusd) or never overflow (the portable loops: every
// partial sum is bounded as the whole), so the sums are exact either way.
// The weights are packed by the library itself (tftpu_gemm_pack, once per op) to
// [O/R][Q/G][R][G]: per step, R consecutive groups of G weights, each broadcast to every lane.
// A register tile is R output channels x T pixels whose sums stay in registers over all of Q,
// then go to a small int32 tile that is requantized row by row straight to the output: 8 x 32
// on zmm (16 accumulators of 32 registers), 5 x 16 on ymm (10 accumulators, two input vectors,
// the broadcast and vpmaddwd's product: 14 of 16; GCC 12 spills accumulators of the fuller
// 6 x 16 and 4 x 24 tiles into memory on every step, which costs more than their better ratio
// of loads to multiplies gains), 4 x 8 on xmm. Q is zero-padded to whole groups (zero rows and zero weights),
// O to whole tiles (zero weights) and the pixels to whole tiles (zero inputs); the padded
// results are dropped.
// gemm: [N, Q, P, O, narrow, lo, hi, zp, -, per_channel, exact32, H, W, kh, kw, sh, sw, pt, pl,
//        dh, dw, OW, zx]: Q rows of the GEMM (C, or C*kh*kw for a KxK conv; kh = 0 for 1x1);
//        narrow: 1 lets the narrow kernel run where it is exact (gemm_offset)
#if defined(TFTPU_AVX512) && defined(__AVX512VNNI__)
struct Gemm {
  using Elem = uint8_t;
  using Weight = int8_t;
  using V = __m512i;
  static constexpr int kGroup = 4, kRows = 8, kVecs = 2, kLanes = 16;
  static V zero() { return _mm512_setzero_si512(); }
  static V load(const Elem* p) { return _mm512_loadu_si512(p); }
  static V bcast(int32_t w) { return _mm512_set1_epi32(w); }
  static V dot(V acc, V a, V b) { return _mm512_dpbusd_epi32(acc, a, b); }
  static void store(int32_t* p, V v) { _mm512_storeu_si512(p, v); }
};
#elif defined(TFTPU_AVX2) && defined(__AVXVNNI__)
struct Gemm {
  using Elem = uint8_t;
  using Weight = int8_t;
  using V = __m256i;
  static constexpr int kGroup = 4, kRows = 5, kVecs = 2, kLanes = 8;
  static V zero() { return _mm256_setzero_si256(); }
  static V load(const Elem* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static V bcast(int32_t w) { return _mm256_set1_epi32(w); }
  static V dot(V acc, V a, V b) { return _mm256_dpbusd_avx_epi32(acc, a, b); }
  static void store(int32_t* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};
#elif defined(TFTPU_AVX512)
struct Gemm {
  using Elem = int16_t;
  using Weight = int16_t;
  using V = __m512i;
  static constexpr int kGroup = 2, kRows = 8, kVecs = 2, kLanes = 16;
  static V zero() { return _mm512_setzero_si512(); }
  static V load(const Elem* p) { return _mm512_loadu_si512(p); }
  static V bcast(int32_t w) { return _mm512_set1_epi32(w); }
  static V dot(V acc, V a, V b) { return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b)); }
  static void store(int32_t* p, V v) { _mm512_storeu_si512(p, v); }
};
#define TFTPU_GEMM_NARROW 1
struct GemmNarrow {
  using Elem = uint8_t;
  using Weight = int8_t;
  using V = __m512i;
  static constexpr int kGroup = 4, kRows = 8, kVecs = 2, kLanes = 16;
  static V zero() { return _mm512_setzero_si512(); }
  static V load(const Elem* p) { return _mm512_loadu_si512(p); }
  static V bcast(int32_t w) { return _mm512_set1_epi32(w); }
  static V dot(V acc, V a, V b) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(a, b), _mm512_set1_epi16(1)));
  }
  static void store(int32_t* p, V v) { _mm512_storeu_si512(p, v); }
};
#elif defined(TFTPU_AVX2)
struct Gemm {
  using Elem = int16_t;
  using Weight = int16_t;
  using V = __m256i;
  static constexpr int kGroup = 2, kRows = 5, kVecs = 2, kLanes = 8;
  static V zero() { return _mm256_setzero_si256(); }
  static V load(const Elem* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static V bcast(int32_t w) { return _mm256_set1_epi32(w); }
  static V dot(V acc, V a, V b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
  static void store(int32_t* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};
#define TFTPU_GEMM_NARROW 1
struct GemmNarrow {
  using Elem = uint8_t;
  using Weight = int8_t;
  using V = __m256i;
  static constexpr int kGroup = 4, kRows = 5, kVecs = 2, kLanes = 8;
  static V zero() { return _mm256_setzero_si256(); }
  static V load(const Elem* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static V bcast(int32_t w) { return _mm256_set1_epi32(w); }
  static V dot(V acc, V a, V b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
  }
  static void store(int32_t* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};
#elif defined(__SSE2__) && !defined(TFTPU_PLAIN_CPP)
// the generic x86-64 build: SSE2 is in every x86-64 CPU, and pmaddwd is SSE2
struct Gemm {
  using Elem = int16_t;
  using Weight = int16_t;
  using V = __m128i;
  static constexpr int kGroup = 2, kRows = 4, kVecs = 2, kLanes = 4;
  static V zero() { return _mm_setzero_si128(); }
  static V load(const Elem* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static V bcast(int32_t w) { return _mm_set1_epi32(w); }
  static V dot(V acc, V a, V b) { return _mm_add_epi32(acc, _mm_madd_epi16(a, b)); }
  static void store(int32_t* p, V v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
};
#else
// other CPUs (aarch64...): plain loops for the compiler to vectorise (-DTFTPU_PLAIN_CPP builds
// them on x86-64 too, to test them)
#define TFTPU_GEMM_PORTABLE 1
struct Gemm {
  using Elem = int16_t;
  using Weight = int16_t;
  static constexpr int kGroup = 2, kRows = 4, kVecs = 1, kLanes = 16;
};
#endif
static_assert(Gemm::kGroup * sizeof(Gemm::Weight) == 4, "a group of weights fills one int32 lane");
#ifdef TFTPU_GEMM_NARROW
static_assert(GemmNarrow::kGroup * sizeof(GemmNarrow::Weight) == 4, "a group of weights fills one int32 lane");
#endif
// The pixels of a register tile of kernel K.
template <typename K>
constexpr int64_t kTilePixels = K::kVecs * K::kLanes;

// One register tile: the sums of kRows output channels over NV vectors of pixels (kVecs: the
// whole tile; 1: the last few pixels of a chunk, which would waste most of a full tile: 49
// pixels are 3 tiles of 16 and 8 more, not 4 tiles), into `tile`. xb: the tile's first pixel in
// the packed input, xstep elements from one group of rows to the next; wb: the tile's output
// channels in the packed weight.
template <typename K, int NV = K::kVecs>
TFTPU_INLINE void gemm_tile(const typename K::Elem* __restrict__ xb, int64_t xstep,
                            const typename K::Weight* __restrict__ wb, int64_t groups,
                            int32_t (*tile)[kTilePixels<K>]) {
#ifndef TFTPU_GEMM_PORTABLE
  typename K::V acc[K::kRows][NV];
#pragma GCC unroll 8
  for (int r = 0; r < K::kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = K::zero();
#pragma GCC unroll 2
  for (int64_t g = 0; g < groups; ++g) {
    typename K::V a[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) a[v] = K::load(xb + g * xstep + v * K::kLanes * K::kGroup);
    const typename K::Weight* wg = wb + g * K::kRows * K::kGroup;
#pragma GCC unroll 8
    for (int r = 0; r < K::kRows; ++r) {
      int32_t wv;
      std::memcpy(&wv, wg + r * K::kGroup, 4);
      const typename K::V b = K::bcast(wv);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = K::dot(acc[r][v], a[v], b);
    }
  }
  // every accumulator leaves its register once, by constant index (a runtime index would keep
  // the whole array in memory, stored on every step of the loop above)
#pragma GCC unroll 8
  for (int r = 0; r < K::kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) K::store(tile[r] + v * K::kLanes, acc[r][v]);
#else
  int32_t acc[K::kRows][kTilePixels<K>] = {};
  for (int64_t g = 0; g < groups; ++g) {
    const typename K::Elem* __restrict__ xg = xb + g * xstep;
    const typename K::Weight* __restrict__ wg = wb + g * K::kRows * K::kGroup;
    for (int r = 0; r < K::kRows; ++r) {
      const int32_t w0 = wg[r * 2], w1 = wg[r * 2 + 1];
      for (int p = 0; p < kTilePixels<K>; ++p) acc[r][p] += int32_t(xg[2 * p]) * w0 + int32_t(xg[2 * p + 1]) * w1;
    }
  }
  std::memcpy(tile, acc, sizeof(acc));
#endif
}

// The weight packing of kernel K (this build's own layout; Python asks its size and has it
// packed once per op): [ceil(O / kRows)][ceil(Q / kGroup)][kRows][kGroup] Weight, zeros past O
// and Q. Builds with a narrow kernel keep both packings, the narrow one after the other at a
// 64-byte offset (gemm_narrow_offset).
template <typename K>
TFTPU_INLINE int64_t gemm_groups(int64_t Q) { return (Q + K::kGroup - 1) / K::kGroup; }

template <typename K>
TFTPU_INLINE int64_t gemm_packed_bytes(int64_t O, int64_t Q) {
  return (O + K::kRows - 1) / K::kRows * K::kRows * gemm_groups<K>(Q) * K::kGroup * sizeof(typename K::Weight);
}

template <typename K>
void gemm_pack(const int8_t* w, int64_t O, int64_t Q, typename K::Weight* out) {
  const int64_t groups = gemm_groups<K>(Q), R = K::kRows, G = K::kGroup;
  std::memset(out, 0, gemm_packed_bytes<K>(O, Q));
  for (int64_t o = 0; o < O; ++o)
    for (int64_t q = 0; q < Q; ++q) out[((o / R * groups + q / G) * R + o % R) * G + q % G] = w[o * Q + q];
}

// The byte offset of the narrow kernel's packing in the packed weight (its whole size where the
// build has no narrow kernel).
TFTPU_INLINE int64_t gemm_narrow_offset(int64_t O, int64_t Q) { return (gemm_packed_bytes<Gemm>(O, Q) + 63) / 64 * 64; }

TFTPU_INLINE int64_t gemm_packed_total(int64_t O, int64_t Q) {
#ifdef TFTPU_GEMM_NARROW
  return gemm_narrow_offset(O, Q) + gemm_packed_bytes<GemmNarrow>(O, Q);
#else
  return gemm_packed_bytes<Gemm>(O, Q);
#endif
}

#if defined(__SSE2__)
// Interleave four rows of np bytes (null: a row of zeros, past the last channel) into dst, four
// bytes a pixel, each byte minus `s` (mod 256: the GEMM's offset, gemm_offset); pixels np..Pt
// are zeros.
[[maybe_unused]] TFTPU_INLINE void interleave(const uint8_t* const rows[4], int64_t np, int64_t Pt, uint8_t s,
                              uint8_t* __restrict__ dst) {
  const __m128i sign = _mm_set1_epi8(char(s));
  const bool whole = rows[0] && rows[1] && rows[2] && rows[3];
  int64_t p = 0;
  if (whole)
    for (; p + 16 <= np; p += 16) {
      const __m128i r0 = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[0] + p)), sign);
      const __m128i r1 = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[1] + p)), sign);
      const __m128i r2 = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[2] + p)), sign);
      const __m128i r3 = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[3] + p)), sign);
      const __m128i t0 = _mm_unpacklo_epi8(r0, r1), t1 = _mm_unpackhi_epi8(r0, r1);
      const __m128i t2 = _mm_unpacklo_epi8(r2, r3), t3 = _mm_unpackhi_epi8(r2, r3);
      __m128i* d = reinterpret_cast<__m128i*>(dst + p * 4);
      _mm_storeu_si128(d + 0, _mm_unpacklo_epi16(t0, t2));
      _mm_storeu_si128(d + 1, _mm_unpackhi_epi16(t0, t2));
      _mm_storeu_si128(d + 2, _mm_unpacklo_epi16(t1, t3));
      _mm_storeu_si128(d + 3, _mm_unpackhi_epi16(t1, t3));
    }
  for (; p < Pt; ++p)
    for (int k = 0; k < 4; ++k) dst[p * 4 + k] = (rows[k] && p < np) ? uint8_t(rows[k][p] - s) : 0;
}

#endif

// Interleave two rows of np bytes (null: a row of zeros, past the last channel) into dst as int16
// pairs, two values a pixel, each byte minus `s` (mod 256, then widened as unsigned); pixels
// np..Pt are zeros.
[[maybe_unused]] TFTPU_INLINE void interleave(const uint8_t* const rows[2], int64_t np, int64_t Pt, uint8_t s,
                                               int16_t* __restrict__ dst) {
  int64_t p = 0;
#if defined(__SSE2__)
  if (rows[0] && rows[1]) {
    const __m128i sign = _mm_set1_epi8(char(s)), zero = _mm_setzero_si128();
    for (; p + 16 <= np; p += 16) {
      const __m128i r0 = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[0] + p)), sign);
      const __m128i r1 = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[1] + p)), sign);
      const __m128i t0 = _mm_unpacklo_epi8(r0, r1), t1 = _mm_unpackhi_epi8(r0, r1);
      __m128i* d = reinterpret_cast<__m128i*>(dst + p * 2);
      _mm_storeu_si128(d + 0, _mm_unpacklo_epi8(t0, zero));
      _mm_storeu_si128(d + 1, _mm_unpackhi_epi8(t0, zero));
      _mm_storeu_si128(d + 2, _mm_unpacklo_epi8(t1, zero));
      _mm_storeu_si128(d + 3, _mm_unpackhi_epi8(t1, zero));
    }
  }
#endif
  for (; p < Pt; ++p)
    for (int k = 0; k < 2; ++k) dst[p * 2 + k] = (rows[k] && p < np) ? int16_t(uint8_t(rows[k][p] - s)) : 0;
}

// dst[i] = src[2 * i] for i < n (a stride-2 conv's row): 16 at a time by keeping the low byte of
// each 16-bit pair; the vector loop reads up to src[2 * i + 31], so it stops while that is at
// most src[2 * (n - 1)], the last byte the row holds.
TFTPU_INLINE void every_other(const uint8_t* __restrict__ src, int64_t n, uint8_t* __restrict__ dst) {
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128i low = _mm_set1_epi16(0x00FF);
  for (; i + 16 < n; i += 16) {
    const __m128i a = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i)), low);
    const __m128i b = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i + 16)), low);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi16(a, b));
  }
#endif
  for (; i < n; ++i) dst[i] = src[2 * i];
}

// The GEMM's input rows: channel c of NCHW data over pixels [p0, p0 + np) (a 1x1 conv), or for a
// KxK conv the im2col row q = (c, ky, kx) (OIHW order), gathered into `buf` with the zero point
// where the window reaches past the input (it then adds (zx - zx) * w = 0).
// geometry: [H, W, kh, kw, sh, sw, pt, pl, dh, dw, OW] (kh = 0: a 1x1 conv, the pixels as they lie)
template <typename In>
TFTPU_INLINE const uint8_t* gemm_row(const In* x, int64_t P, int64_t q, int64_t p0, int64_t np, const int64_t* g,
                                     In zx, In* __restrict__ buf) {
  if (g[2] == 0) return reinterpret_cast<const uint8_t*>(x + q * P + p0);
  const int64_t H = g[0], W = g[1], kh = g[2], kw = g[3], sh = g[4], sw = g[5], pt = g[6], pl = g[7], dh = g[8],
                dw = g[9], OW = g[10];
  const int64_t c = q / (kh * kw), ky = q / kw % kh, kx = q % kw;
  const In* plane = x + c * H * W;
  int64_t p = p0;
  while (p < p0 + np) {              // one output row (oy) at a time
    const int64_t oy = p / OW, ox0 = p % OW, ox1 = std::min(OW, ox0 + (p0 + np - p));
    const int64_t iy = oy * sh - pt + ky * dh, off = kx * dw - pl;
    In* __restrict__ d = buf + (p - p0) - ox0;
    if (iy < 0 || iy >= H) {
      for (int64_t ox = ox0; ox < ox1; ++ox) d[ox] = zx;
    } else {
      const In* __restrict__ r = plane + iy * W;
      // the columns whose ix = ox * sw + off lies in [0, W)
      const int64_t lo = std::min(ox1, std::max(ox0, off >= 0 ? 0 : (-off + sw - 1) / sw));
      const int64_t hi = std::max(lo, std::min(ox1, W - 1 - off < 0 ? 0 : (W - 1 - off) / sw + 1));
      for (int64_t ox = ox0; ox < lo; ++ox) d[ox] = zx;
      if (sw == 1)
        for (int64_t ox = lo; ox < hi; ++ox) d[ox] = r[ox + off];
      else if (sw == 2)
        every_other(reinterpret_cast<const uint8_t*>(r + lo * 2 + off), hi - lo, reinterpret_cast<uint8_t*>(d + lo));
      else
        for (int64_t ox = lo; ox < hi; ++ox) d[ox] = r[ox * sw + off];
      for (int64_t ox = hi; ox < ox1; ++ox) d[ox] = zx;
    }
    p += ox1 - ox0;
  }
  return reinterpret_cast<const uint8_t*>(buf);
}

template <typename K, typename In>
TFTPU_INLINE void pack_pixels(const In* x, int64_t Q, int64_t P, int64_t p0, int64_t np, int64_t groups, int64_t Pt,
                              uint8_t s, const int64_t* g, In zx, In* bufs, typename K::Elem* __restrict__ xp) {
  constexpr int G = K::kGroup;
  for (int64_t j = 0; j < groups; ++j) {
    const uint8_t* rows[G];
    for (int k = 0; k < G; ++k) {
      const int64_t q = j * G + k;
      rows[k] = q < Q ? gemm_row(x, P, q, p0, np, g, zx, bufs + k * np) : nullptr;
    }
    interleave(rows, np, Pt, s, xp + j * Pt * G);     // four bytes or two int16 a pixel
  }
}

// The pixels a thread packs and computes at a time: as many whole tiles as keep the packed input
// within kChunkBytes (L2-resident), at least four (packing im2col rows a few pixels at a time
// costs more than the cache misses of a larger chunk), so that each output channel's weights
// and requantizer serve all of the chunk's tiles (small Q: many tiles) while the chunk's input
// stays in cache for every output tile.
constexpr int64_t kChunkBytes = 256 << 10;

// bias: the int64 bias of each output channel with the offset's term folded in (tftpu_gemm).
// sums_out: the pass over a 16-bit input's high bytes (tftpu_gemm_link), which stores each sum
// (without bias) there and requantizes nothing; sums_in: the pass over its low bytes, which
// requantizes 256 * sums_in + its own sums (int64) with the bias.
template <typename K, typename In, typename Out>
TFTPU_INLINE void gemm_impl(const In* x, const typename K::Weight* w, const int64_t* bias, const int32_t* mult,
                            const int32_t* rshift, Out* y, const int64_t* p, uint8_t s, int64_t p0, int64_t p1,
                            int64_t o0, int64_t o1, int32_t* sums_out = nullptr,
                            const int32_t* sums_in = nullptr) {
  constexpr int64_t G = K::kGroup, R = K::kRows, T = kTilePixels<K>;
  const int64_t N = p[0], Q = p[1], P = p[2], O = p[3], lo = p[5], hi = p[6], zp = p[7];
  const bool per_channel = p[9] != 0, exact32 = p[10] != 0;
  const int64_t np = p1 - p0, groups = gemm_groups<K>(Q);
  if (np <= 0 || o1 <= o0) return;
  const int64_t tile_bytes = groups * G * T * int64_t(sizeof(typename K::Elem));
  const int64_t chunk = std::min(std::max<int64_t>(4, kChunkBytes / tile_bytes) * T, (np + T - 1) / T * T);
  const int64_t* g = p + 11;
  const int64_t plane = g[2] == 0 ? Q * P : (Q / (g[2] * g[3])) * g[0] * g[1];   // one image's input
  typename K::Elem* const xp = scratch<typename K::Elem>(0, groups * chunk * G);
  In* const bufs = scratch<In>(1, g[2] == 0 ? 0 : G * chunk);
  alignas(64) int32_t tile[R][T];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c0 = 0; c0 < np; c0 += chunk) {
      const int64_t nc = std::min(chunk, np - c0), Pt = (nc + T - 1) / T * T;
      pack_pixels<K>(x + n * plane, Q, P, p0 + c0, nc, groups, Pt, s, g, In(p[22]), bufs, xp);
      for (int64_t ob = o0; ob < o1; ob += R) {     // o0 is a multiple of R (the split's grain)
        const int rows = int(std::min<int64_t>(R, o1 - ob));
        Channel cs[R];
        int32_t b32[R];
        for (int r = 0; r < rows; ++r) {
          const int64_t o = ob + r, k = per_channel ? o : 0;
          cs[r] = channel(bias[o], mult[k], rshift[k], lo, hi, zp);
          b32[r] = int32_t(uint32_t(uint64_t(bias[o])));
        }
        alignas(64) unsigned char rq_bytes[R][sizeof(RequantV)];  // built only for the rows used
        RequantV* const rqs = reinterpret_cast<RequantV*>(rq_bytes);
        if (exact32)
          for (int r = 0; r < rows; ++r) new (rqs + r) RequantV(cs[r]);
        const typename K::Weight* wb = w + ob / R * groups * R * G;
        for (int64_t pt = 0; pt < Pt; pt += T) {
          const int64_t valid = std::min<int64_t>(T, nc - pt);
          if (K::kVecs > 1 && valid <= K::kLanes)
            gemm_tile<K, 1>(xp + pt * G, Pt * G, wb, groups, tile);
          else
            gemm_tile<K>(xp + pt * G, Pt * G, wb, groups, tile);
          for (int r = 0; r < rows; ++r) {
            const int64_t at = (n * O + ob + r) * P + p0 + c0 + pt;
            Out* dst = y + at;
            if (sums_out) {
              std::memcpy(sums_out + at, tile[r], valid * sizeof(int32_t));
            } else if (sums_in && exact32) {
              // every sum plus bias fits int32 (the caller's bound for 16-bit data): wrapping int32
              // arithmetic gives it exactly, as above
              alignas(64) int32_t whole[T];
              for (int64_t i = 0; i < valid; ++i)
                whole[i] = int32_t((uint32_t(sums_in[at + i]) << 8) + uint32_t(tile[r][i]));
              requant_exact32(whole, valid, b32[r], cs[r], rqs[r], dst);
            } else if (sums_in) {
              int64_t whole[T];
              for (int64_t i = 0; i < valid; ++i) whole[i] = int64_t(sums_in[at + i]) * 256 + tile[r][i];
              requant_run(whole, valid, cs[r], dst);
            } else if (exact32)
              requant_exact32(tile[r], valid, b32[r], cs[r], rqs[r], dst);
            else
              requant_run(tile[r], valid, cs[r], dst);
          }
        }
      }
    }
}

// Element-wise Add/Sub of two INT8 / UINT8 / INT16 tensors of one shape: ((a - za) * ma +
// (b - zb) * mb) shifted right by r with ties away from zero, then zero point and clamp. Where the
// storage types' ranges bound |a - za| * |ma| + |b - zb| * |mb| + 2**(r-1) below 2**31 (every
// INT8 pair with |ma|, |mb| <= 2**15; an INT16 link read with the power-of-two multipliers its
// scale is chosen for), int32 arithmetic is exact, and int32 lanes vectorise twice as wide as
// int64 ones. Other constants take the int64 loop (the same integers).
// add: [n, za, zb, ma, mb, r, lo, hi, zp]
template <typename A, typename B, typename Out>
void add32(const A* __restrict__ a, const B* __restrict__ b, Out* __restrict__ out, int64_t n, int32_t za, int32_t zb,
           int32_t ma, int32_t mb, int r, int32_t lo, int32_t hi, int32_t zp) {
  const int32_t half = r > 0 ? int32_t(1) << (r - 1) : 0;
  if (r > 0)
    for (int64_t i = 0; i < n; ++i) {
      int32_t s = (int32_t(a[i]) - za) * ma + (int32_t(b[i]) - zb) * mb;
      s = (s + half + (s >> 31)) >> r;         // s >> 31: -1 where s < 0 (an arithmetic shift)
      out[i] = Out(std::min(std::max(s, lo), hi) + zp);
    }
  else
    for (int64_t i = 0; i < n; ++i) {
      const int32_t s = (int32_t(a[i]) - za) * ma + (int32_t(b[i]) - zb) * mb;
      out[i] = Out(std::min(std::max(s, lo), hi) + zp);
    }
}

template <typename A, typename B, typename Out>
TFTPU_INLINE void add_impl(const A* a, const B* b, Out* out, const int64_t* p, int64_t i0, int64_t i1) {
  const int64_t za = p[1], zb = p[2], ma = p[3], mb = p[4], lo = p[6] - p[8], hi = p[7] - p[8], zp = p[8];
  const int r = int(p[5]);
  const auto within = [](int64_t v, int64_t bound) { return v >= -bound && v <= bound; };
  // the largest |x - z| of a storage type T
  const auto reach = [](auto* tag, int64_t z) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return std::max(std::abs(int64_t(std::numeric_limits<T>::min()) - z),
                    std::abs(int64_t(std::numeric_limits<T>::max()) - z));
  };
  const bool small = within(za, 1 << 16) && within(zb, 1 << 16) && within(ma, int64_t(1) << 31) &&
                     within(mb, int64_t(1) << 31) && r >= 0 && r <= 31;
  if (small && reach(static_cast<A*>(nullptr), za) * std::abs(ma) + reach(static_cast<B*>(nullptr), zb) * std::abs(mb) +
                   (r > 0 ? int64_t(1) << (r - 1) : 0) < (int64_t(1) << 31) &&
      within(lo, 1 << 20) && within(hi, 1 << 20) && within(zp, 1 << 20)) {
    add32(a + i0, b + i0, out + i0, i1 - i0, int32_t(za), int32_t(zb), int32_t(ma), int32_t(mb), r, int32_t(lo),
          int32_t(hi), int32_t(zp));
    return;
  }
  const int64_t half = r > 0 ? int64_t(1) << (r - 1) : 0;
  for (int64_t i = i0; i < i1; ++i) {
    int64_t s = (int64_t(a[i]) - za) * ma + (int64_t(b[i]) - zb) * mb;
    if (r > 0) s = (s + half - (s >> 63 & 1)) >> r;
    out[i] = Out(std::min(std::max(s, lo), hi) + zp);
  }
}

// Float32 to integers as tftpu.rounding.quantize: round(double(x) / scale) half away from zero (C's round),
// plus the zero point, saturated to [lo, hi]. Returns false on a NaN (the caller's numpy path
// decides what a NaN becomes). quantize: [n, zp, lo, hi] and the scale as a double.
// AVX2 builds take 4 at a time (GCC does not vectorise the scalar loop: the conversions may
// trap), rounding without round(): t = trunc(v), then t + trunc(2 * (v - t)), which adds the
// sign of v exactly where |v - t| >= 1/2. Exact: v - t is v's fraction (Sterbenz: t and v
// are within a factor 2 once |t| >= 1; t = 0 leaves v; |v| >= 2**52 is an integer, t = v),
// doubling it is exact and |2 (v - t)| < 2. An infinite v has a NaN fraction, taken as 0 so
// that it clamps as the scalar loop does. The clamped value lies in [lo, hi], within int32.
template <typename Out>
bool quantize_run(const float* __restrict__ x, int64_t n, double scale, double zp, double lo, double hi,
                  Out* __restrict__ out) {
  bool nan = false;
  int64_t i = 0;
#ifdef TFTPU_AVX2
  const __m256d vs = _mm256_set1_pd(scale), vzp = _mm256_set1_pd(zp), vlo = _mm256_set1_pd(lo),
                vhi = _mm256_set1_pd(hi), two = _mm256_set1_pd(2.0);
  constexpr int kTrunc = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
  __m256d bad = _mm256_setzero_pd();
  for (; i + 4 <= n; i += 4) {
    const __m256d v = _mm256_div_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), vs);
    bad = _mm256_or_pd(bad, _mm256_cmp_pd(v, v, _CMP_UNORD_Q));
    const __m256d t = _mm256_round_pd(v, kTrunc);
    __m256d d = _mm256_sub_pd(v, t);
    d = _mm256_and_pd(d, _mm256_cmp_pd(d, d, _CMP_ORD_Q));                // infinities: 0
    const __m256d r = _mm256_add_pd(t, _mm256_round_pd(_mm256_mul_pd(d, two), kTrunc));
    const __m256d c = _mm256_min_pd(_mm256_max_pd(_mm256_add_pd(r, vzp), vlo), vhi);
    alignas(16) int32_t q[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(q), _mm256_cvttpd_epi32(c));
    for (int k = 0; k < 4; ++k) out[i + k] = Out(q[k]);
  }
  nan = _mm256_movemask_pd(bad) != 0;
#endif
  for (; i < n; ++i) {
    const double v = double(x[i]) / scale;
    nan |= v != v;
    const double r = std::round(v);      // half away from zero, exactly
    out[i] = Out(int64_t(std::min(std::max(r + zp, lo), hi)));
  }
  return !nan;
}

template <typename Out>
TFTPU_INLINE bool quantize_impl(const float* x, double scale, const int64_t* p, Out* out, int64_t i0, int64_t i1) {
  return quantize_run(x + i0, i1 - i0, scale, double(p[1]), double(p[2]), double(p[3]), out + i0);
}

template <typename T>
TFTPU_INLINE void lookup_impl(const uint8_t* x, const T* table, T* out, int64_t a, int64_t b) {
  for (int64_t i = a; i < b; ++i) out[i] = table[x[i]];
}

// A 16-bit `tpu.Lut`: u = x + 32768, i = u >> knot_bits, f = u & (2^knot_bits - 1),
// out = clamp((t[i] * 2^knot_bits + (t[i + 1] - t[i]) * f + half) >> shift, lo, hi) over the
// int32 knots t (2^(16 - knot_bits) + 1 of them), shift = knot_bits + the table's fraction bits.
template <typename Out>
TFTPU_INLINE void interpolate_impl(const int16_t* x, const int32_t* t, Out* out, int knot_bits, int shift,
                                   int64_t lo, int64_t hi, int64_t a, int64_t b) {
  const int64_t half = int64_t{1} << (shift - 1);
  const int32_t mask = (1 << knot_bits) - 1;
  for (int64_t j = a; j < b; ++j) {
    const int32_t u = int32_t{x[j]} + 32768;
    const int64_t l = t[u >> knot_bits], h = t[(u >> knot_bits) + 1];
    const int64_t y = (l * (int64_t{1} << knot_bits) + (h - l) * (u & mask) + half) >> shift;
    out[j] = static_cast<Out>(y < lo ? lo : (y > hi ? hi : y));
  }
}

// Storage kinds: 0 int8, 1 uint8, 2 int16, 3 int32 (outputs); accumulators 0 int32, 1 int64.
template <typename Fn>
TFTPU_INLINE int with_out(int kind, Fn fn) {
  switch (kind) {
    case 0: fn(static_cast<int8_t*>(nullptr)); return 0;
    case 1: fn(static_cast<uint8_t*>(nullptr)); return 0;
    case 2: fn(static_cast<int16_t*>(nullptr)); return 0;
    case 3: fn(static_cast<int32_t*>(nullptr)); return 0;
    default: return 1;
  }
}

template <typename Fn>
TFTPU_INLINE int with_in(int kind, Fn fn) {
  switch (kind) {
    case 0: fn(static_cast<int8_t*>(nullptr)); return 0;
    case 1: fn(static_cast<uint8_t*>(nullptr)); return 0;
    default: return 1;
  }
}

// The inputs of Add/Sub: the conv inputs and INT16 (a 16-bit link).
template <typename Fn>
TFTPU_INLINE int with_add_in(int kind, Fn fn) {
  if (kind == 2) {
    fn(static_cast<int16_t*>(nullptr));
    return 0;
  }
  return with_in(kind, fn);
}

// ---------------------------------------------------------------- threads
// A small pool of workers for the calls above: each call is split into `parts` ranges, the caller
// runs the first and the workers the rest. Between calls workers spin for kSpinMicros (the next
// op usually follows within tens of microseconds) and then sleep on a condition variable, so an
// idle process costs nothing. One call at a time uses the pool; a concurrent caller runs its whole
// range itself. A forked child starts without workers (pthread_atfork) and makes its own.
constexpr int64_t kSpinMicros = 200;

class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) std::thread([this, i] { loop(i + 1); }).detach();
    size_ = workers + 1;
  }
  int size() const { return size_; }
  bool try_acquire() { return !busy_.test_and_set(std::memory_order_acquire); }
  void release() { busy_.clear(std::memory_order_release); }

  // Run job(k) for k in [0, parts) (parts <= size()): k = 0 here, the others on workers.
  void run(int parts, const std::function<void(int)>& job) {
    job_ = &job;
    parts_ = parts;
    remaining_.store(size_ - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      gen_.fetch_add(1, std::memory_order_release);
    }
    if (sleeping_.load(std::memory_order_acquire) > 0) cv_.notify_all();
    job(0);
    while (remaining_.load(std::memory_order_acquire) > 0) pause();
  }

 private:
  static void pause() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }

  void loop(int k) {
    uint64_t seen = 0;
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      uint64_t g;
      for (int i = 0;; ++i) {
        g = gen_.load(std::memory_order_acquire);
        if (g != seen) break;
        pause();
        if ((i & 255) == 255 &&
            std::chrono::steady_clock::now() - start > std::chrono::microseconds(kSpinMicros)) {
          std::unique_lock<std::mutex> lock(mu_);
          sleeping_.fetch_add(1, std::memory_order_acq_rel);
          cv_.wait(lock, [&] { return gen_.load(std::memory_order_acquire) != seen; });
          sleeping_.fetch_sub(1, std::memory_order_acq_rel);
          g = gen_.load(std::memory_order_acquire);
          break;
        }
      }
      seen = g;
      if (k < parts_) (*job_)(k);
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  int size_ = 1;
  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> remaining_{0}, sleeping_{0};
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 0;
};

std::atomic<Pool*> g_pool{nullptr};
std::mutex g_pool_mu;
int g_threads = 1;

void forget_pool_in_child() { g_pool.store(nullptr); }   // the parent's workers do not exist here

Pool* pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p || g_threads <= 1) return p;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  p = g_pool.load(std::memory_order_acquire);
  if (!p) {
    static bool registered = (pthread_atfork(nullptr, nullptr, forget_pool_in_child), true);
    (void)registered;
    p = new Pool(g_threads - 1);
    g_pool.store(p, std::memory_order_release);
  }
  return p;
}

// f(a, b) over [lo, hi) in up to `parts` pieces whose bounds (but the last) are multiples of grain.
template <typename F>
void split_run(int64_t lo, int64_t hi, int64_t grain, int parts, F f) {
  const int64_t blocks = (hi - lo + grain - 1) / grain;
  Pool* p = parts > 1 && blocks > 1 ? pool() : nullptr;
  if (!p || !p->try_acquire()) {
    f(lo, hi);
    return;
  }
  const int n = int(std::min<int64_t>({int64_t(parts), int64_t(p->size()), blocks}));
  const std::function<void(int)> job = [&](int k) {
    const int64_t a = lo + blocks * k / n * grain, b = std::min(hi, lo + blocks * (k + 1) / n * grain);
    if (a < b) f(a, b);
  };
  p->run(n, job);
  p->release();
}

// The offset s of a GEMM's input (the kernels multiply the bytes u = x - s, mod 256) and whether
// the narrow kernel takes it. By default s = -128 for int8 data (u = x + 128 = x ^ 0x80) and
// s = 0 for uint8, so u = x - s lies in [0, 255]: every kernel but the narrow one takes that.
// The narrow kernel (vpmaddubsw, builds without VNNI) multiplies u by weights in [-128, 127] and
// adds two products into a saturating int16, exact only while u <= 127 (2 * 127 * 128 = 32512 <
// 2**15): where every input value (and the zero point, which the im2col padding holds) lies in
// [lo, lo + 127], s = lo makes u = x - lo in [0, 127] (the byte subtraction wraps to the exact
// value). Typical: the non-negative outputs of a ReLU with zero point 0. The scan of the input
// (one pass, stopped once the range is wider) costs little next to the GEMM's Q multiply-adds per
// output value; it runs on the calling thread (sharing it out cost a second hand-over to the
// workers per conv, which on a loaded machine cost more than the scan). params[4] = 0 keeps the
// default (tests compare the two kernels on one input). gemm params as tftpu_gemm's; returns 1
// where the narrow kernel applies.
template <typename In>
int gemm_offset(const In* x, const int64_t* p, int64_t* s) {
  const int64_t N = p[0], Q = p[1], P = p[2];
  const int64_t* g = p + 11;
  *s = std::is_same_v<In, int8_t> ? -128 : 0;
#ifdef TFTPU_GEMM_NARROW
  if (p[4] == 0) return 0;
  const int64_t n = N * (g[2] == 0 ? Q * P : (Q / (g[2] * g[3])) * g[0] * g[1]);
  int32_t lo = g[2] == 0 ? 255 : int32_t(In(p[22])), hi = g[2] == 0 ? -128 : int32_t(In(p[22]));
  constexpr int64_t kStep = 4096;
  for (int64_t i = 0; i < n && hi - lo <= 127; i += kStep) {     // stops once the range is wider
    const In* __restrict__ v = x + i;
    const int64_t k = std::min(kStep, n - i);
    In a = v[0], b = v[0];
    int64_t j = 0;
    if (k >= 32) {                          // 32 bytes a step (GCC leaves the scalar loop scalar)
      __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)), vb = va;
      for (; j + 32 <= k; j += 32) {
        const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + j));
        if constexpr (std::is_same_v<In, int8_t>) {
          va = _mm256_min_epi8(va, u);
          vb = _mm256_max_epi8(vb, u);
        } else {
          va = _mm256_min_epu8(va, u);
          vb = _mm256_max_epu8(vb, u);
        }
      }
      alignas(32) In la[32], lb[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(la), va);
      _mm256_store_si256(reinterpret_cast<__m256i*>(lb), vb);
      for (int t = 0; t < 32; ++t) {
        a = std::min(a, la[t]);
        b = std::max(b, lb[t]);
      }
    }
    for (; j < k; ++j) {
      a = std::min(a, v[j]);
      b = std::max(b, v[j]);
    }
    lo = std::min(lo, int32_t(a));
    hi = std::max(hi, int32_t(b));
  }
  if (n > 0 && hi - lo <= 127) {
    *s = lo;
    return 1;
  }
#else
  (void)x, (void)N, (void)Q, (void)P, (void)g;
#endif
  return 0;
}

}  // namespace

extern "C" {

#ifndef TFTPU_ISA_NAME
#define TFTPU_ISA_NAME "unnamed"
#endif
#ifndef TFTPU_SOURCE_SHA256
#define TFTPU_SOURCE_SHA256 ""
#endif
// The instruction-set variant this library was built for (tftpu.utils.isa) and the sha256 of the
// source it was built from (set by the build; tftpu.utils.native does not load a stale build).
const char* tftpu_isa() { return TFTPU_ISA_NAME; }
const char* tftpu_source_sha256() { return TFTPU_SOURCE_SHA256; }

// Returns 0, or 1 for a storage kind it does not know.
// Every entry point runs its range [o0, o1) in up to `parts` pieces on the pool. They return 0,
// or 1 for a storage kind they do not know.
void tftpu_set_threads(int threads) { g_threads = std::max(1, threads); }

int tftpu_requant(const void* acc, int acc_kind, void* out, int out_kind, const int64_t* params,
                  const int32_t* bias, const int32_t* mult, const int32_t* rshift, int64_t o0, int64_t o1,
                  int parts) {
  const Tables t{bias, mult, rshift};
  if (acc_kind != 0 && acc_kind != 1) return 1;
  return with_out(out_kind, [&](auto* tag) {
    using Out = std::remove_pointer_t<decltype(tag)>;
    split_run(o0, o1, 1, parts, [&](int64_t a, int64_t b) {
      if (acc_kind == 0)
        requant_impl(static_cast<const int32_t*>(acc), static_cast<Out*>(out), params, t, a, b);
      else
        requant_impl(static_cast<const int64_t*>(acc), static_cast<Out*>(out), params, t, a, b);
    });
  });
}

int tftpu_depthwise(const void* x, int in_kind, const int8_t* w, void* out, int out_kind, const int64_t* params,
                    const int32_t* bias, const int32_t* mult, const int32_t* rshift, int64_t o0, int64_t o1,
                    int parts) {
  const Tables t{bias, mult, rshift};
  int status = 0;
  // a 16-bit link (zero point 0: its values are already centred int16) as well as 8-bit data
  if (in_kind == 2 && params[4] != 0) return 1;
  status |= with_add_in(in_kind, [&](auto* in_tag) {
    using In = std::remove_pointer_t<decltype(in_tag)>;
    status |= with_out(out_kind, [&](auto* out_tag) {
      using Out = std::remove_pointer_t<decltype(out_tag)>;
      split_run(o0, o1, 1, parts, [&](int64_t a, int64_t b) {
        depthwise_impl(static_cast<const In*>(x), w, static_cast<Out*>(out), params, t, a, b);
      });
    });
  });
  return status;
}

// Whether tftpu_gemm exists in this build: every build has one (the portable loops at least).
int tftpu_has_gemm() { return 1; }

// The bytes of an [O][Q] int8 weight packed for this build's GEMM(s), and the packing (once per op).
int64_t tftpu_gemm_packed_size(int64_t O, int64_t Q) { return gemm_packed_total(O, Q); }

void tftpu_gemm_pack(const int8_t* w, int64_t O, int64_t Q, void* out) {
  gemm_pack<Gemm>(w, O, Q, static_cast<Gemm::Weight*>(out));
#ifdef TFTPU_GEMM_NARROW
  std::memset(static_cast<char*>(out) + gemm_packed_bytes<Gemm>(O, Q), 0,
              gemm_narrow_offset(O, Q) - gemm_packed_bytes<Gemm>(O, Q));
  char* const narrow = static_cast<char*>(out) + gemm_narrow_offset(O, Q);
  gemm_pack<GemmNarrow>(w, O, Q, reinterpret_cast<GemmNarrow::Weight*>(narrow));
#endif
}

// Which kernel tftpu_gemm runs on input x (gemm_offset): 1 the narrow one, 0 the other; *s the
// offset (-1 for an input kind it does not know).
int tftpu_gemm_offset(const void* x, int in_kind, const int64_t* params, int64_t* s) {
  *s = -1;
  if (in_kind == 0) return gemm_offset(static_cast<const int8_t*>(x), params, s);
  if (in_kind == 1) return gemm_offset(static_cast<const uint8_t*>(x), params, s);
  return 0;
}

}  // extern "C"

namespace {

// tftpu_gemm's body: `offset` more (times each channel's weight sum) folded into the bias, the
// input's own offset (gemm_offset) stored in *s_used; sums_out / sums_in as gemm_impl's.
int gemm_pass(const void* x, int in_kind, const void* w, const int64_t* bias, const int32_t* mult,
              const int32_t* rshift, void* out, int out_kind, const int64_t* params, int64_t p0, int64_t p1,
              int64_t o0, int64_t o1, int parts, int64_t offset, int64_t* s_used, int32_t* sums_out,
              const int32_t* sums_in) {
  const int64_t O = params[3], Q = params[1];
  int status = 0;
  status |= with_in(in_kind, [&](auto* in_tag) {
    using In = std::remove_pointer_t<decltype(in_tag)>;
    int64_t s;
    [[maybe_unused]] const bool narrow = gemm_offset(static_cast<const In*>(x), params, &s);
    *s_used = s;
    std::vector<int64_t> folded(std::max<int64_t>(o1, 0));
    for (int64_t o = o0; o < o1; ++o) folded[o] = bias[o] + (s + offset) * bias[O + o];
    status |= with_out(out_kind, [&](auto* out_tag) {
      using Out = std::remove_pointer_t<decltype(out_tag)>;
      const auto run = [&](auto* kernel_tag, const auto* wp) {
        using K = std::remove_pointer_t<decltype(kernel_tag)>;
        constexpr int64_t R = K::kRows, T = kTilePixels<K>;
        // the split that shares the work most evenly: pixel tiles (each thread packs only its own
        // pixels) unless the output-channel tiles divide better
        const int64_t tiles = (p1 - p0 + T - 1) / T, blocks = (o1 - o0 + R - 1) / R, k = std::max(parts, 1);
        const double by_pixels = double((tiles + k - 1) / k) * k / double(tiles);
        const double by_outputs = double((blocks + k - 1) / k) * k / double(blocks);
        if (p1 - p0 >= 2 * T && by_pixels <= by_outputs)
          split_run(p0, p1, T, parts, [&](int64_t a, int64_t b) {
            gemm_impl<K>(static_cast<const In*>(x), wp, folded.data(), mult, rshift, static_cast<Out*>(out), params,
                         uint8_t(s), a, b, o0, o1, sums_out, sums_in);
          });
        else
          split_run(o0, o1, R, parts, [&](int64_t a, int64_t b) {
            gemm_impl<K>(static_cast<const In*>(x), wp, folded.data(), mult, rshift, static_cast<Out*>(out), params,
                         uint8_t(s), p0, p1, a, b, sums_out, sums_in);
          });
      };
#ifdef TFTPU_GEMM_NARROW
      if (narrow) {
        run(static_cast<GemmNarrow*>(nullptr), reinterpret_cast<const GemmNarrow::Weight*>(
                                                   static_cast<const char*>(w) + gemm_narrow_offset(O, Q)));
        return;
      }
#endif
      run(static_cast<Gemm*>(nullptr), static_cast<const Gemm::Weight*>(w));
    });
  });
  return status;
}

}  // namespace

extern "C" {

// w: packed by tftpu_gemm_pack; bias: 2 * O int64, the bias of each output channel with the zero
// point's term folded in (b[o] - zx * sum_q w[o][q]) and then sum_q w[o][q] (the offset s adds
// s * sum_q w[o][q]: sum w * (x - zx) = sum w * (x - s) + (s - zx) * sum w). Splits the pixels
// (whole tiles) or the output channels (whole tiles), whichever shares out more evenly; o0 must be
// 0 or a multiple of the chosen kernel's tile rows.
// params[4]: 1 lets the narrow kernel run where it is exact (gemm_offset).
int tftpu_gemm(const void* x, int in_kind, const void* w, const int64_t* bias, const int32_t* mult,
               const int32_t* rshift, void* out, int out_kind, const int64_t* params, int64_t p0, int64_t p1,
               int64_t o0, int64_t o1, int parts) {
  int64_t s;
  return gemm_pass(x, in_kind, w, bias, mult, rshift, out, out_kind, params, p0, p1, o0, o1, parts, 0, &s, nullptr,
                   nullptr);
}

// An ungrouped conv of 16-bit NCHW data (a 16-bit link) as the chip runs it: two INT8 GEMM passes
// over its bytes, x = 256 * hi + lo with hi = x >> 8 (INT8) and lo = x & 255 (UINT8), each exact
// in int32, combined exactly in int64 (256 * hi's sums + lo's) and requantized as tftpu_gemm
// requantizes. hi, lo: the two byte planes (NCHW, as the input); params as tftpu_gemm's, with
// params[22] the 16-bit zero point (each plane pads with its own byte of it); sums: N * O * P
// int32 of scratch for the high pass. Each pass takes its own kernel (the high bytes of a link
// mostly span few values: the narrow one).
int tftpu_gemm_link(const void* hi, const void* lo, const void* w, const int64_t* bias, const int32_t* mult,
                    const int32_t* rshift, void* out, int out_kind, const int64_t* params, int32_t* sums, int parts) {
  std::vector<int64_t> ph(params, params + 23), pl(params, params + 23);
  const int64_t zx = params[22], P = params[2], O = params[3];
  ph[22] = zx >> 8;                  // an arithmetic shift: floor(zx / 256), as the planes are split
  pl[22] = zx & 0xFF;
  int64_t s_hi, s_lo;
  int status = gemm_pass(hi, 0, w, bias, mult, rshift, out, out_kind, ph.data(), 0, P, 0, O, parts, 0, &s_hi, sums,
                         nullptr);
  if (status) return status;
  // x - zx = 256 (hi - s_hi) + (lo - s_lo) + 256 s_hi + s_lo - zx: the passes sum the bytes less
  // their offsets, and the low pass's bias (b - zx * sum(w), tftpu_gemm's) takes both offsets' terms
  return gemm_pass(lo, 1, w, bias, mult, rshift, out, out_kind, pl.data(), 0, P, 0, O, parts, 256 * s_hi, &s_lo,
                   nullptr, sums);
}

int tftpu_add(const void* a, int a_kind, const void* b, int b_kind, void* out, int out_kind,
              const int64_t* params, int64_t i0, int64_t i1, int parts) {
  int status = 0;
  status |= with_add_in(a_kind, [&](auto* a_tag) {
    using A = std::remove_pointer_t<decltype(a_tag)>;
    status |= with_add_in(b_kind, [&](auto* b_tag) {
      using B = std::remove_pointer_t<decltype(b_tag)>;
      status |= with_out(out_kind, [&](auto* out_tag) {
        using Out = std::remove_pointer_t<decltype(out_tag)>;
        split_run(i0, i1, 64, parts, [&](int64_t u, int64_t v) {
          add_impl(static_cast<const A*>(a), static_cast<const B*>(b), static_cast<Out*>(out), params, u, v);
        });
      });
    });
  });
  return status;
}

int tftpu_quantize(const float* x, double scale, void* out, int out_kind, const int64_t* params, int parts) {
  std::atomic<bool> ok{true};
  const int status = with_out(out_kind, [&](auto* tag) {
    using Out = std::remove_pointer_t<decltype(tag)>;
    split_run(0, params[0], 64, parts, [&](int64_t a, int64_t b) {
      if (!quantize_impl(x, scale, params, static_cast<Out*>(out), a, b)) ok = false;
    });
  });
  return status ? status : (ok ? 0 : 3);
}

// out[i] = table[x[i]]: a 256-entry table of `entry_bytes` (1, 2 or 4) bytes each, indexed by bytes.
int tftpu_lookup(const uint8_t* x, const void* table, int entry_bytes, void* out, int64_t n, int parts) {
  switch (entry_bytes) {
    case 1:
      split_run(0, n, 4096, parts, [&](int64_t a, int64_t b) {
        lookup_impl(x, static_cast<const uint8_t*>(table), static_cast<uint8_t*>(out), a, b);
      });
      return 0;
    case 2:
      split_run(0, n, 4096, parts, [&](int64_t a, int64_t b) {
        lookup_impl(x, static_cast<const uint16_t*>(table), static_cast<uint16_t*>(out), a, b);
      });
      return 0;
    case 4:
      split_run(0, n, 4096, parts, [&](int64_t a, int64_t b) {
        lookup_impl(x, static_cast<const uint32_t*>(table), static_cast<uint32_t*>(out), a, b);
      });
      return 0;
    default:
      return 1;
  }
}

int tftpu_interpolate(const int16_t* x, const int32_t* table, int knot_bits, int shift, int64_t lo, int64_t hi,
                      int out_kind, void* out, int64_t n, int parts) {
  if (knot_bits < 1 || knot_bits > 15 || shift <= knot_bits || shift > 40) return 1;
  return with_out(out_kind, [&](auto* tag) {
    using Out = std::remove_pointer_t<decltype(tag)>;
    split_run(0, n, 4096, parts, [&](int64_t a, int64_t b) {
      interpolate_impl(x, table, static_cast<Out*>(out), knot_bits, shift, lo, hi, a, b);
    });
  });
}

// float32 -> float16 by the CPU's converter (F16C: nearest, ties to even; subnormals, infinities
// and quiet NaNs as IEEE and numpy's astype have them). 1 where this build has no converter.
int tftpu_has_f16() {
#if defined(__F16C__)
  return 1;
#else
  return 0;
#endif
}

int tftpu_to_f16(const float* x, uint16_t* out, int64_t n, int parts) {
#if defined(__F16C__)
  split_run(0, n, 4096, parts, [&](int64_t a, int64_t b) {
    int64_t i = a;
    for (; i + 8 <= b; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    }
    for (; i < b; ++i) out[i] = static_cast<uint16_t>(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  });
  return 0;
#else
  (void)x, (void)out, (void)n, (void)parts;
  return 1;
#endif
}

// float16 -> float32 by the CPU's converter (F16C: exact; subnormals and infinities as numpy's
// astype has them, NaNs quiet). 1 where this build has no converter.
int tftpu_from_f16(const uint16_t* x, float* out, int64_t n, int parts) {
#if defined(__F16C__)
  split_run(0, n, 4096, parts, [&](int64_t a, int64_t b) {
    int64_t i = a;
    for (; i + 8 <= b; i += 8) {
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
    }
    for (; i < b; ++i) out[i] = _cvtsh_ss(x[i]);
  });
  return 0;
#else
  (void)x, (void)out, (void)n, (void)parts;
  return 1;
#endif
}

}  // extern "C"

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
// Built with -march=native (tftpu.utils.native keys the cached build by the CPU's features): the
// loops below are written for the compiler to vectorise (int64 products need AVX-512DQ or
// AVX2's 32x32->64 multiplies).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define TFTPU_AVX512 1
#endif

#define TFTPU_INLINE inline __attribute__((always_inline))

namespace {

constexpr int64_t kInt32Min = -(int64_t(1) << 31);
constexpr int64_t kInt32Max = (int64_t(1) << 31) - 1;

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
// and the bias may be passed wrapped to int32. One-byte outputs take AVX-512 16 lanes at a time:
// the doubling high multiply as two vpmuldq (even and odd lanes) in int64, the rounding shift in
// int64, the clamp in int32.
#ifdef TFTPU_AVX512
// requant_exact32's arithmetic on 16 int32 lanes (sums plus bias already added).
struct Requant16 {
  __m512i vm, vadd, vhalf, vlo, vhi, vzp;
  __m128i vshift, vr;
  bool round;

  explicit Requant16(const Channel& c)
      : vm(_mm512_set1_epi64(c.m)), vadd(_mm512_set1_epi64(c.combined ? c.add : int64_t(1) << 30)),
        vhalf(_mm512_set1_epi64(c.half)), vlo(_mm512_set1_epi32(int32_t(c.lo))),
        vhi(_mm512_set1_epi32(int32_t(c.hi))), vzp(_mm512_set1_epi32(int32_t(c.zp))),
        vshift(_mm_cvtsi64_si128(c.combined ? c.shift : 31)), vr(_mm_cvtsi64_si128(c.r)),
        round(!c.combined && c.r > 0) {}

  TFTPU_INLINE __m128i operator()(__m512i t) const {
    __m512i ev = _mm512_sra_epi64(_mm512_add_epi64(_mm512_mul_epi32(t, vm), vadd), vshift);
    __m512i od = _mm512_sra_epi64(_mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(t, 32), vm), vadd), vshift);
    if (round) {
      ev = _mm512_sra_epi64(_mm512_add_epi64(_mm512_add_epi64(ev, vhalf), _mm512_srai_epi64(ev, 63)), vr);
      od = _mm512_sra_epi64(_mm512_add_epi64(_mm512_add_epi64(od, vhalf), _mm512_srai_epi64(od, 63)), vr);
    }
    __m512i y = _mm512_mask_blend_epi32(__mmask16(0xAAAA), ev, _mm512_slli_epi64(od, 32));
    y = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(y, vlo), vhi), vzp);
    return _mm512_cvtepi32_epi8(y);
  }
};
#endif

template <typename Out>
TFTPU_INLINE void requant_exact32(const int32_t* __restrict__ acc, int64_t n, int32_t bias, const Channel& c,
                                  Out* __restrict__ out) {
#ifdef TFTPU_AVX512
  if constexpr (sizeof(Out) == 1) {
    const Requant16 rq(c);
    const __m512i vb = _mm512_set1_epi32(bias);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
      _mm_mask_storeu_epi8(out + i, k, rq(_mm512_add_epi32(_mm512_maskz_loadu_epi32(k, acc + i), vb)));
    }
    return;
  }
#endif
  const Channel c0 = channel(0, c.m, c.r, c.lo + c.zp, c.hi + c.zp, c.zp);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = int32_t(uint32_t(acc[i]) + uint32_t(bias));
    requant_run(&t, 1, c0, out + i);
  }
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

// A depthwise conv (one filter per channel) over the channels [c0, c1) of every image, with the
// channels innermost so that every loop runs along them (NCHW planes are too small to vectorise
// along: 7x7 at the end of MobileNetV2). The input is copied once, centred (x - zx) and zero-padded,
// to [Hp][Wp][c1 - c0] int16; each output row accumulates [OW][c1 - c0] int32 sums over the taps,
// is requantized along the channels and written back to the NCHW planes.
// A depthwise conv (one filter per channel) of the planes of channels [c0, c1), each plane in one
// long vectorisable loop per tap. The plane is copied once, centred (x - zx) and zero-padded, into
// sh * sw phase planes (phase (a, b) holds padded rows a, a + sh, ... and columns b, b + sw, ...:
// the polyphase split of a strided conv), each Wq = ceil(Wp / sw) wide. Output (oy, ox) then reads
// tap (ky, kx) from phase ((ky*dh) % sh, (kx*dw) % sw) at flat index oy*Wq + ox + constant: every
// tap is one loop over all oy*Wq + ox at once (the columns ox >= OW are computed and dropped),
// padded to a multiple of 16 so that no loop has a scalar remainder.
constexpr int64_t kVector = 16, kBlock = 512;

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
  std::vector<int16_t> phases(sh * sw * phase_size);
  std::vector<int32_t> acc(kBlock);
  std::vector<Out> out(L);
  std::vector<int16_t> row(sw * Wq);
  std::vector<int64_t> taps(kh * kw);        // where each tap reads, in the phases buffer
  for (int64_t ky = 0; ky < kh; ++ky)
    for (int64_t kx = 0; kx < kw; ++kx)
      taps[ky * kw + kx] = ((ky * dh % sh) * sw + kx * dw % sw) * phase_size + (ky * dh / sh) * Wq + kx * dw / sw;
#ifdef TFTPU_AVX512
  std::vector<__m512i> wv(kh * kw);
#endif
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ch = c0; ch < c1; ++ch) {
      std::fill(phases.begin(), phases.end(), int16_t(0));
      const In* plane = x + (n * C + ch) * H * W;
      for (int64_t iy = 0; iy < H; ++iy) {
        const int64_t Y = iy + pt;
        const In* __restrict__ src = plane + iy * W;
        int16_t* __restrict__ first = phases.data() + (Y % sh) * sw * phase_size + (Y / sh) * Wq;
        if (sw == 1) {                       // the row itself, centred, at column pl
          int16_t* __restrict__ d = first + pl;
          for (int64_t ix = 0; ix < W; ++ix) d[ix] = int16_t(int32_t(src[ix]) - z);
          continue;
        }
        // the padded row centred (zeros around), then dealt out to the sw column phases
        int16_t* __restrict__ r = row.data();
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
#ifdef TFTPU_AVX512
      if constexpr (sizeof(Out) == 1)
        if (exact32) {      // 16 outputs at a time, their sums in one register over all the taps
          const Requant16 rq(cq);
          const __m512i vb = _mm512_set1_epi32(int32_t(cq.bias));
          for (int64_t k = 0; k < kh * kw; ++k) wv[k] = _mm512_set1_epi32(wc[k]);
          for (int64_t i = 0; i < L; i += kVector) {
            __m512i a = vb;
            for (int64_t k = 0; k < kh * kw; ++k) {
              const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(phases.data() + taps[k] + i));
              a = _mm512_add_epi32(a, _mm512_mullo_epi32(_mm512_cvtepi16_epi32(xs), wv[k]));
            }
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out.data() + i), rq(a));
          }
          Out* dst = y + (n * C + ch) * OH * OW;
          for (int64_t oy = 0; oy < OH; ++oy) std::memcpy(dst + oy * OW, out.data() + oy * Wq, OW * sizeof(Out));
          continue;
        }
#endif
      // blocks of kBlock outputs keep their sums in L1 while every tap adds to them
      for (int64_t i0 = 0; i0 < L; i0 += kBlock) {
        const int64_t nb = std::min(kBlock, L - i0);
        int32_t* __restrict__ a = acc.data();
        std::fill(a, a + nb, 0);
        for (int64_t ky = 0; ky < kh; ++ky)
          for (int64_t kx = 0; kx < kw; ++kx) {
            const int32_t wv = wc[ky * kw + kx];
            if (wv == 0) continue;
            const int64_t pa = ky * dh % sh, pb = kx * dw % sw;
            const int16_t* __restrict__ src =
                phases.data() + (pa * sw + pb) * phase_size + (ky * dh / sh) * Wq + kx * dw / sw + i0;
            for (int64_t i = 0; i < nb; ++i) a[i] += int32_t(src[i]) * wv;
          }
        if (exact32)
          requant_exact32(a, nb, int32_t(cq.bias), cq, out.data() + i0);
        else
          requant_run(a, nb, cq, out.data() + i0);
      }
      Out* dst = y + (n * C + ch) * OH * OW;
      for (int64_t oy = 0; oy < OH; ++oy) std::memcpy(dst + oy * OW, out.data() + oy * Wq, OW * sizeof(Out));
    }
}

// An ungrouped conv of NCHW data as an INT8 GEMM on AVX-512 VNNI: out[o][p] = sum_q w[o][q] *
// (row_q[p] - zx) + bias[o], requantized, where the rows are the input channels (1x1, stride 1,
// unpadded) or the im2col rows (c, ky, kx) of any other kernel. vpdpbusd multiplies unsigned by
// signed bytes and adds each group of four products to an int32 lane without saturating, so the
// sums are exact: the input is offset to unsigned (x ^ 0x80 = x + 128 for int8) and the caller
// folds -(zx + offset) * sum_q w[o][q] into the int64 bias. The pixels [p0, p1) of each image are
// packed to [Q/4][pixels][4] bytes (four rows of one pixel per int32 lane), 32 pixels a tile;
// each tile meets eight output channels at a time (16 accumulators), then each row of the tile
// is requantized straight to the output.
// gemm: [N, Q, P, O, Q4, lo, hi, zp, xor_sign, per_channel, exact32, H, W, kh, kw, sh, sw, pt, pl,
//             dh, dw, OW, zx]: Q rows of the GEMM (C, or C*kh*kw for a KxK conv; kh = 0 for 1x1)
#if defined(__AVX512VNNI__) && defined(TFTPU_AVX512)
constexpr bool kHaveVnni = true;

// Interleave four rows of np bytes (null: a row of zeros, past the last channel) into dst, four
// bytes a pixel, flipping the sign bit where `flip`; pixels np..Pt are zeros.
TFTPU_INLINE void interleave4(const uint8_t* const rows[4], int64_t np, int64_t Pt, bool flip,
                              uint8_t* __restrict__ dst) {
  const __m128i sign = _mm_set1_epi8(flip ? char(0x80) : 0);
  const bool whole = rows[0] && rows[1] && rows[2] && rows[3];
  int64_t p = 0;
  if (whole)
    for (; p + 16 <= np; p += 16) {
      const __m128i r0 = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[0] + p)), sign);
      const __m128i r1 = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[1] + p)), sign);
      const __m128i r2 = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[2] + p)), sign);
      const __m128i r3 = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[3] + p)), sign);
      const __m128i t0 = _mm_unpacklo_epi8(r0, r1), t1 = _mm_unpackhi_epi8(r0, r1);
      const __m128i t2 = _mm_unpacklo_epi8(r2, r3), t3 = _mm_unpackhi_epi8(r2, r3);
      __m128i* d = reinterpret_cast<__m128i*>(dst + p * 4);
      _mm_storeu_si128(d + 0, _mm_unpacklo_epi16(t0, t2));
      _mm_storeu_si128(d + 1, _mm_unpackhi_epi16(t0, t2));
      _mm_storeu_si128(d + 2, _mm_unpacklo_epi16(t1, t3));
      _mm_storeu_si128(d + 3, _mm_unpackhi_epi16(t1, t3));
    }
  const uint8_t s = flip ? 0x80 : 0;
  for (; p < Pt; ++p)
    for (int k = 0; k < 4; ++k) dst[p * 4 + k] = (rows[k] && p < np) ? uint8_t(rows[k][p] ^ s) : 0;
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
      else
        for (int64_t ox = lo; ox < hi; ++ox) d[ox] = r[ox * sw + off];
      for (int64_t ox = hi; ox < ox1; ++ox) d[ox] = zx;
    }
    p += ox1 - ox0;
  }
  return reinterpret_cast<const uint8_t*>(buf);
}

template <typename In>
TFTPU_INLINE void pack_pixels(const In* x, int64_t C, int64_t P, int64_t p0, int64_t np, int64_t C4, int64_t Pt,
                              bool flip, const int64_t* g, In zx, In* bufs, uint8_t* __restrict__ xp) {
  for (int64_t c4 = 0; c4 < C4; ++c4) {
    const uint8_t* rows[4];
    for (int k = 0; k < 4; ++k) {
      const int64_t q = c4 * 4 + k;
      rows[k] = q < C ? gemm_row(x, P, q, p0, np, g, zx, bufs + k * np) : nullptr;
    }
    interleave4(rows, np, Pt, flip, xp + c4 * Pt * 4);
  }
}

template <typename In, typename Out>
TFTPU_INLINE void gemm_impl(const In* x, const int8_t* w, const int64_t* bias, const int32_t* mult,
                                 const int32_t* rshift, Out* y, const int64_t* p, int64_t p0, int64_t p1,
                                 int64_t o0, int64_t o1) {
  const int64_t N = p[0], C = p[1], P = p[2], O = p[3], C4 = p[4], lo = p[5], hi = p[6], zp = p[7];
  const bool flip = p[8] != 0, per_channel = p[9] != 0, exact32 = p[10] != 0;
  const int64_t np = p1 - p0, Pt = (np + 31) / 32 * 32;
  if (np <= 0 || o1 <= o0) return;
  const int64_t* g = p + 11;
  const int64_t plane = g[2] == 0 ? C * P : (C / (g[2] * g[3])) * g[0] * g[1];   // one image's input
  std::vector<uint8_t> xp(C4 * Pt * 4);
  std::vector<In> bufs(g[2] == 0 ? 0 : 4 * np);
  alignas(64) int32_t tile[8][32];
  for (int64_t n = 0; n < N; ++n) {
    pack_pixels(x + n * plane, C, P, p0, np, C4, Pt, flip, g, In(p[22]), bufs.data(), xp.data());
    for (int64_t pt = 0; pt < Pt; pt += 32) {
      const int64_t valid = std::min<int64_t>(32, np - pt);
      for (int64_t ob = o0; ob < o1; ob += 8) {
        __m512i acc[8][2];
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
        const uint8_t* xb = xp.data() + pt * 4;
        const int8_t* wb = w + ob * C4 * 4;     // rows padded to a multiple of 8 by the caller
        for (int64_t c4 = 0; c4 < C4; ++c4) {
          const __m512i a0 = _mm512_loadu_si512(xb + c4 * Pt * 4);
          const __m512i a1 = _mm512_loadu_si512(xb + c4 * Pt * 4 + 64);
#pragma GCC unroll 8
          for (int r = 0; r < 8; ++r) {
            int32_t wv;
            std::memcpy(&wv, wb + (r * C4 + c4) * 4, 4);
            const __m512i b = _mm512_set1_epi32(wv);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], a0, b);
            acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], a1, b);
          }
        }
        // every accumulator leaves its register once, by constant index (a runtime index would
        // keep the whole array in memory, stored on every step of the loop above)
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
          _mm512_store_si512(tile[r], acc[r][0]);
          _mm512_store_si512(tile[r] + 16, acc[r][1]);
        }
        const int64_t rows = std::min<int64_t>(8, o1 - ob);
        for (int r = 0; r < rows; ++r) {
          const int64_t o = ob + r, k = per_channel ? o : 0;
          const Channel c = channel(bias[o], mult[k], rshift[k], lo, hi, zp);
          if (exact32)
            requant_exact32(tile[r], valid, int32_t(uint32_t(uint64_t(bias[o]))), c, y + (n * O + o) * P + p0 + pt);
          else
            requant_run(tile[r], valid, c, y + (n * O + o) * P + p0 + pt);
        }
      }
    }
  }
}
#else
constexpr bool kHaveVnni = false;
#endif

// Element-wise Add/Sub of two INT8 tensors of one shape: ((a - za) * ma + (b - zb) * mb) shifted
// right by r with ties away from zero, then zero point and clamp. The caller keeps |ma|, |mb|
// below 2**15, so the int64 sums equal the int32 ones of the reference.
// add: [n, za, zb, ma, mb, r, lo, hi, zp]
template <typename A, typename B, typename Out>
TFTPU_INLINE void add_impl(const A* a, const B* b, Out* out, const int64_t* p, int64_t i0, int64_t i1) {
  const int64_t za = p[1], zb = p[2], ma = p[3], mb = p[4], lo = p[6] - p[8], hi = p[7] - p[8], zp = p[8];
  const int r = int(p[5]);
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
template <typename Out>
TFTPU_INLINE bool quantize_impl(const float* __restrict__ x, double scale, const int64_t* p, Out* __restrict__ out,
                                int64_t i0, int64_t i1) {
  const double zp = double(p[1]), lo = double(p[2]), hi = double(p[3]);
  bool nan = false;
  for (int64_t i = i0; i < i1; ++i) {
    const double v = double(x[i]) / scale;
    nan |= v != v;
    const double r = std::round(v);      // half away from zero, exactly
    out[i] = Out(int64_t(std::min(std::max(r + zp, lo), hi)));
  }
  return !nan;
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
  status |= with_in(in_kind, [&](auto* in_tag) {
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

// Whether tftpu_gemm exists in this build (AVX-512 VNNI).
int tftpu_has_gemm() { return kHaveVnni ? 1 : 0; }

// Returns 2 where the build has no GEMM kernel. Splits the pixels (32 a tile) or the output
// channels (8 a block), whichever shares out more evenly.
int tftpu_gemm(const void* x, int in_kind, const int8_t* w, const int64_t* bias, const int32_t* mult,
                    const int32_t* rshift, void* out, int out_kind, const int64_t* params, int64_t p0, int64_t p1,
                    int64_t o0, int64_t o1, int parts) {
#if defined(__AVX512VNNI__) && defined(TFTPU_AVX512)
  int status = 0;
  status |= with_in(in_kind, [&](auto* in_tag) {
    using In = std::remove_pointer_t<decltype(in_tag)>;
    status |= with_out(out_kind, [&](auto* out_tag) {
      using Out = std::remove_pointer_t<decltype(out_tag)>;
      // the split that shares the work most evenly: pixel tiles (each thread packs only its own
      // pixels) unless the output-channel blocks divide better
      const int64_t tiles = (p1 - p0 + 31) / 32, blocks = (o1 - o0 + 7) / 8, k = std::max(parts, 1);
      const double by_pixels = double((tiles + k - 1) / k) * k / double(tiles);
      const double by_outputs = double((blocks + k - 1) / k) * k / double(blocks);
      if (p1 - p0 >= 64 && by_pixels <= by_outputs)
        split_run(p0, p1, 32, parts, [&](int64_t a, int64_t b) {
          gemm_impl(static_cast<const In*>(x), w, bias, mult, rshift, static_cast<Out*>(out), params, a, b,
                         o0, o1);
        });
      else
        split_run(o0, o1, 8, parts, [&](int64_t a, int64_t b) {
          gemm_impl(static_cast<const In*>(x), w, bias, mult, rshift, static_cast<Out*>(out), params, p0, p1,
                         a, b);
        });
    });
  });
  return status;
#else
  return 2;
#endif
}

int tftpu_add(const void* a, int a_kind, const void* b, int b_kind, void* out, int out_kind,
              const int64_t* params, int64_t i0, int64_t i1, int parts) {
  int status = 0;
  status |= with_in(a_kind, [&](auto* a_tag) {
    using A = std::remove_pointer_t<decltype(a_tag)>;
    status |= with_in(b_kind, [&](auto* b_tag) {
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

}  // extern "C"

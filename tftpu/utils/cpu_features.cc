// The CPU's features as CPUID and the OS report them (through libgcc's __builtin_cpu_supports,
// which also checks that the OS saves the AVX/AVX-512 registers), named as /proc/cpuinfo names
// them. tftpu.utils.native picks the kernels' instruction-set variant from these rather than
// from /proc/cpuinfo, which an emulator or a container may not make agree with CPUID.
// Built in the portable (generic) variant only.

#include <cstring>

extern "C" {

#ifndef TFTPU_ISA_NAME
#define TFTPU_ISA_NAME "unnamed"
#endif
#ifndef TFTPU_SOURCE_SHA256
#define TFTPU_SOURCE_SHA256 ""
#endif
const char* tftpu_isa() { return TFTPU_ISA_NAME; }
const char* tftpu_source_sha256() { return TFTPU_SOURCE_SHA256; }

// Writes the space-separated names of the features this CPU has into buf (n bytes, NUL
// included); returns the length needed, or -1 where this is not an x86-64 CPU.
int tftpu_cpu_flags(char* buf, int n) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const struct {
    const char* name;
    bool has;
  } features[] = {
      {"avx", bool(__builtin_cpu_supports("avx"))},
      {"avx2", bool(__builtin_cpu_supports("avx2"))},
      {"bmi1", bool(__builtin_cpu_supports("bmi"))},
      {"bmi2", bool(__builtin_cpu_supports("bmi2"))},
      {"f16c", bool(__builtin_cpu_supports("f16c"))},
      {"fma", bool(__builtin_cpu_supports("fma"))},
      {"abm", bool(__builtin_cpu_supports("lzcnt"))},
      {"movbe", bool(__builtin_cpu_supports("movbe"))},
      {"xsave", bool(__builtin_cpu_supports("avx"))},   // AVX usable implies XSAVE enabled by the OS
      {"avx512f", bool(__builtin_cpu_supports("avx512f"))},
      {"avx512bw", bool(__builtin_cpu_supports("avx512bw"))},
      {"avx512cd", bool(__builtin_cpu_supports("avx512cd"))},
      {"avx512dq", bool(__builtin_cpu_supports("avx512dq"))},
      {"avx512vl", bool(__builtin_cpu_supports("avx512vl"))},
      {"avx512_vnni", bool(__builtin_cpu_supports("avx512vnni"))},
      {"avx_vnni", bool(__builtin_cpu_supports("avxvnni"))},
  };
  int len = 0;
  for (const auto& f : features) {
    if (!f.has) continue;
    const int k = int(std::strlen(f.name)) + (len ? 1 : 0);
    if (len + k < n) {
      if (len) buf[len] = ' ';
      std::memcpy(buf + len + (len ? 1 : 0), f.name, std::strlen(f.name));
      buf[len + k] = '\0';
    }
    len += k;
  }
  if (n > 0 && len == 0) buf[0] = '\0';
  return len + 1;
#else
  (void)buf;
  (void)n;
  return -1;
#endif
}

}  // extern "C"

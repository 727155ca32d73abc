/* The clock a core runs at, from a chain of dependent adds (one a cycle on every x86-64
 * core since long): the FMA peak of the CPU results is two 256-bit FMAs a cycle at this
 * clock. Usage: cc -O1 -o clock_probe bench/cpu/clock_probe.c && chrt -f 10 ./clock_probe */
#include <stdio.h>
#include <time.h>

int main(void) {
  const unsigned long n = 2000000000UL;
  unsigned long x = 0;
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (unsigned long i = 0; i < n; i += 8)
    __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0"
                     : "+r"(x));
  clock_gettime(CLOCK_MONOTONIC, &b);
  const double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
  printf("dependent adds: %.2f GHz (%lu adds)\n", (double)n / s / 1e9, x);
  return 0;
}

/* A cache-thrashing neighbour for the busy-machine runs (bench/claims-ab --busy): writes one
 * byte per 64-byte line over 64 MiB (or argv[1] MiB), forever. Pinned to the server's CPU it
 * takes half the core and leaves the caches cold at every switch back to the server. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    size_t size = (size_t)(argc > 1 ? strtoull(argv[1], 0, 10) : 64) << 20;
    volatile uint8_t *p = malloc(size);
    if (!p)
        return 1;
    memset((void *)p, 1, size);
    for (;;)
        for (size_t i = 0; i < size; i += 64)
            p[i]++;
}

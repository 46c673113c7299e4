/* A program outside the tree, built against an installed osprey only through pkg-config (issue 20's
 * `make install`): it includes the public headers as <osprey/...> and calls into libosprey.a. Prints
 * the engine's default block size and the status text of OSP_OK; exit 0 when both are as expected. */
#include <stdio.h>
#include <string.h>

#include <osprey/engine.h>
#include <osprey/status.h>

int main(void) {
    const osp_engine_params p = osp_engine_default_params();
    const char *ok = osp_status_str(OSP_OK);
    printf("block_size %d, OSP_OK: %s\n", p.block_size, ok);
    return p.block_size > 0 && ok && strlen(ok) > 0 ? 0 : 1;
}

/* libFuzzer target for the runtime kernel selection table's parser (src/backend/kernel_table.c).
 *
 * Input: the text of a table (`osprey bench-kernels --make-table` writes them). It parses or is
 * rejected with a message; a parsed table is then asked for every op kind's choice on a device it
 * matches and on one it does not. A crash, a sanitizer report, a leak or a silent rejection is a bug.
 * Seeds: tests/fuzz/corpus/kernel_table/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kernel_table.h"
#include "osprey/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    osp_kernel_table *t = NULL;
    if (osp_kernel_table_parse((const char *)data, size, "fuzz", &t) != OSP_OK) {
        if (!osp_last_error()[0] || t) abort(); /* a rejection always says why, and returns nothing */
        return 0;
    }
    osp_device_info same = {.device = t->device, .arch = t->arch, .driver_major = t->driver_major};
    osp_device_info other = {.device = OSP_DEVICE_CUDA, .arch = t->arch + 10, .driver_major = t->driver_major};
    const int32_t dims[] = {0, 32, 64, 128, 256};
    for (int k = 0; k < OSP_OP_COUNT; k++)
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
            for (int kv = 0; kv < 2; kv++) {
                const osp_kernel_target tg = {.arch = t->arch, .head_dim = dims[i], .kv_dtype = (osp_kv_dtype)kv};
                osp_kernel_choice a = osp_kernel_table_choose(t, &same, &tg, (osp_op_kind)k);
                osp_kernel_choice b = osp_kernel_table_choose(t, &other, &tg, (osp_op_kind)k);
                if (b.from_table || (a.from_table && !a.version)) abort();
            }
    osp_kernel_table_free(t);
    return 0;
}

/* osprey info: a GGUF file's header, metadata (long arrays abbreviated) and tensor table. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "osprey_internal.h"
#include "osprey/gguf.h"

static void print_str(osp_gguf_str s, size_t max) {
    putchar('"');
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char ch = (unsigned char)s.data[i];
        if (ch == '\n') fputs("\\n", stdout);
        else if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\x%02x", ch);
        else putchar(ch);
    }
    putchar('"');
    if (s.len > max) printf("... (%" PRIu64 " bytes)", s.len);
}

static void print_value(const osp_gguf_value *v, int depth) {
    switch (v->type) {
    case OSP_GGUF_TYPE_UINT8: case OSP_GGUF_TYPE_UINT16: case OSP_GGUF_TYPE_UINT32:
    case OSP_GGUF_TYPE_UINT64:
        printf("%" PRIu64, v->v.u64);
        break;
    case OSP_GGUF_TYPE_INT8: case OSP_GGUF_TYPE_INT16: case OSP_GGUF_TYPE_INT32: case OSP_GGUF_TYPE_INT64:
        printf("%" PRId64, v->v.i64);
        break;
    case OSP_GGUF_TYPE_FLOAT32: case OSP_GGUF_TYPE_FLOAT64: printf("%g", v->v.f64); break;
    case OSP_GGUF_TYPE_BOOL: fputs(v->v.u64 ? "true" : "false", stdout); break;
    case OSP_GGUF_TYPE_STRING: print_str(v->v.str, 120); break;
    case OSP_GGUF_TYPE_ARRAY: {
        const uint64_t n = v->v.arr.n, show = n < 8 ? n : 8;
        printf("[%s x %" PRIu64 "] [", osp_gguf_type_name(v->v.arr.elem_type), n);
        for (uint64_t i = 0; i < show; i++) {
            if (i) fputs(", ", stdout);
            if (v->v.arr.elem_type == OSP_GGUF_TYPE_STRING) print_str(v->v.arr.strs[i], 40);
            else if (v->v.arr.elem_type == OSP_GGUF_TYPE_ARRAY) {
                if (depth < 3) print_value(&v->v.arr.elems[i], depth + 1);
                else fputs("...", stdout);
            } else if (v->v.arr.elem_type == OSP_GGUF_TYPE_FLOAT32 || v->v.arr.elem_type == OSP_GGUF_TYPE_FLOAT64)
                printf("%g", osp_gguf_arr_f64(v, i));
            else printf("%" PRId64, osp_gguf_arr_i64(v, i));
        }
        fputs(n > show ? ", ...]" : "]", stdout);
        break;
    }
    }
}

static const char k_help[] =
    "usage: osprey info -m FILE\n"
    "  print a GGUF file's header, metadata (long arrays abbreviated) and tensor table\n"
    "\n"
    "  -m, --model FILE        the GGUF file (required)\n"
    "  -h, --help              this text\n";

int cmd_info(int argc, char **argv) {
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) cli_help(k_help);
        else if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) model = i + 1 < argc ? argv[++i] : NULL;
        else cli_die(OSP_OK, "info: unknown option '%s'", argv[i]);
    }
    if (!model) cli_die(OSP_OK, "info needs -m FILE");
    osp_gguf *g;
    osp_status s = osp_gguf_open(model, &g);
    if (s != OSP_OK) cli_die(s, "cannot load model");
    printf("file: %s\nversion: %u\nalignment: %u\ndata offset: %" PRIu64 "\n", osp_gguf_path(g),
           osp_gguf_version(g), osp_gguf_alignment(g), osp_gguf_data_offset(g));
    printf("\nmetadata (%" PRIu64 " keys):\n", osp_gguf_n_kv(g));
    for (uint64_t i = 0; i < osp_gguf_n_kv(g); i++) {
        const osp_gguf_kv *kv = osp_gguf_kv_at(g, i);
        printf("  %-44s %-4s = ", kv->key, osp_gguf_type_name(kv->value.type));
        print_value(&kv->value, 0);
        putchar('\n');
    }
    uint64_t total = 0;
    printf("\ntensors (%" PRIu64 "):\n", osp_gguf_n_tensors(g));
    for (uint64_t i = 0; i < osp_gguf_n_tensors(g); i++) {
        const osp_gguf_tensor *t = osp_gguf_tensor_at(g, i);
        char shape[96];
        int o = snprintf(shape, sizeof shape, "[");
        for (uint32_t d = 0; d < t->n_dims; d++)
            o += snprintf(shape + o, sizeof shape - (size_t)o, d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
        snprintf(shape + o, sizeof shape - (size_t)o, "]");
        printf("  %-32s %-6s %-20s offset %-12" PRIu64 " %" PRIu64 " bytes\n", t->name,
               osp_dtype_name(t->type), shape, t->offset, t->nbytes);
        total += t->nbytes;
    }
    printf("\ntotal tensor bytes: %" PRIu64 "\n", total);
    osp_gguf_close(g);
    return 0;
}
